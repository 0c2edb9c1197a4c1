// test-heap-trim.cpp - when the worker hands freed memory back to the system: once the
// bytes malloc holds free rose by the threshold over their lowest since the last trim.
#include "heap_trim.h"
#include "service_test.h"

#include <cstddef>
#include <cstdio>
#include <vector>

using namespace meshnet;

TEST("a trim is due once the threshold was freed since the low point or the last trim") {
    constexpr size_t mib = 1u << 20;
    struct row { size_t free_bytes; bool due; const char * why; };
    const std::vector<row> table = {
        {4 * mib,  false, "a little free after the start"},
        {20 * mib, true,  "16 MiB freed since the start"},
        {20 * mib, false, "nothing freed since the trim"},
        {30 * mib, false, "10 MiB freed since"},
        {36 * mib, true,  "16 MiB freed since the trim"},
        {6 * mib,  false, "a burst took the free memory again"},
        {21 * mib, false, "15 MiB freed since that low"},
        {22 * mib, true,  "16 MiB freed since that low: pages used again are resident again"},
    };
    heap_trim_policy policy(16 * mib);
    for (const row & r : table) {
        const bool due = policy.due(r.free_bytes);
        if (due != r.due) std::printf("  %s: %s\n", r.why, due ? "due" : "not due");
        CHECK(due == r.due);
    }
}

TEST_MAIN()
