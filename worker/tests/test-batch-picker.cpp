// test-batch-picker.cpp - which queued steps share an engine step, as a table: arrival
// order, one step per session, the token limit, the group size, and batch invariance.
#include "batch_picker.h"
#include "service_test.h"

#include <cstdio>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

// "a1 b1 c7": session a with one token, b with one, c with seven
std::vector<queued_step> queue_of(const std::string & spec) {
    std::vector<queued_step> queue;
    size_t i = 0;
    while (i < spec.size()) {
        const size_t end = spec.find(' ', i);
        const std::string item = spec.substr(i, end == std::string::npos ? std::string::npos : end - i);
        queue.push_back({session_key{"r", 1, item.substr(0, 1)}, std::stoll(item.substr(1))});
        i = end == std::string::npos ? spec.size() : end + 1;
    }
    return queue;
}

struct row {
    const char *        queue;
    batch_limits        limits;
    std::vector<size_t> picked;
};

} // namespace

TEST("the picker's table") {
    const batch_limits any{512, SIZE_MAX, 0};
    const batch_limits exact{512, SIZE_MAX, 8};
    const std::vector<row> table = {
        {"a1",                      any,   {0}},
        {"a1 b1 c1",                any,   {0, 1, 2}},
        {"a1 a1 b1",                any,   {0, 2}},           // one step per session
        {"a400 b200 c100",          any,   {0, 2}},           // 512 tokens at most
        {"a600 b1",                 any,   {0}},              // the oldest always runs
        {"a1 b1 c1 d1",             {512, 2, 0}, {0, 1}},     // pipeline groups
        {"a1 b30 c1",               any,   {0, 1, 2}},        // without invariance: mixed
        {"a1 b30 c1",               exact, {0, 2}},           // decodes without the prefill
        {"a30 b1 c1",               exact, {0}},              // a prefill alone
        {"a1 b1 c1 d1 e1 f1 g1 h1 i1 j1", exact, {0, 1, 2, 3, 4, 5, 6, 7}},  // 8 rows at most
        {"a1 b1 c1 d1",             {512, 3, 8}, {0, 1, 2}},  // the smaller limit wins
    };
    for (const row & r : table) {
        const std::vector<size_t> picked = pick_batch(queue_of(r.queue), r.limits);
        if (picked != r.picked) {
            std::printf("  queue \"%s\": picked", r.queue);
            for (size_t i : picked) std::printf(" %zu", i);
            std::printf("\n");
        }
        CHECK(picked == r.picked);
    }
    CHECK(pick_batch({}, any).empty());
}

int main(int argc, char ** argv) {
    return meshnet_test::run_all(argc, argv);
}
