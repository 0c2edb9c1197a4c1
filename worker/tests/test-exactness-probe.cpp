// test-exactness-probe.cpp - the start-up probe (exactness_probe.h) on the fake engine: a
// stage whose rows are computed each by itself measures every width and shared steps exact;
// the fake first stage, whose rows record where their step began (its history field), is
// found inexact from two rows on; --exact-batch-rows only lowers the result; the probe
// leaves every slot empty.
#include "exactness_probe.h"
#include "fake_engine.h"
#include "service_test.h"

#include <algorithm>
#include <string>
#include <vector>

using namespace meshnet;

TEST("a stage that computes each row by itself measures 8 rows and shared steps exact") {
    fake_engine last(8, 4, 8, 4, 64);
    const exactness found = measure_exactness(last, 8, 512);
    CHECK_EQ(found.step_rows, 8);
    CHECK(found.batching);
    CHECK(found.detail.find("steps of 1..8 rows") != std::string::npos);
    CHECK_EQ(last.kv_used(), static_cast<int64_t>(0)); // no trace in any slot
    const std::vector<size_t> sizes = last.batch_sizes();
    CHECK(!sizes.empty() && *std::max_element(sizes.begin(), sizes.end()) == 4); // 4 slots shared steps
}

TEST("rows that depend on the step they came in are found inexact from that width on") {
    fake_engine first(8, 0, 4, 4, 64); // each row holds the step's first position (history)
    const exactness found = measure_exactness(first, 8, 512);
    CHECK_EQ(found.step_rows, 1);
    CHECK(!found.batching);
    CHECK(found.detail.find("a step of 2 rows differs from one-row steps at position 2") != std::string::npos);
    CHECK_EQ(first.kv_used(), static_cast<int64_t>(0));
}

TEST("--exact-batch-rows lowers what is measured; 0 runs no step and claims nothing") {
    fake_engine last(8, 4, 8, 4, 64);
    CHECK_EQ(measure_exactness(last, 3, 512).step_rows, 3);
    CHECK_EQ(measure_exactness(last, 8, 2).step_rows, 2); // no step wider than --batch
    fake_engine untouched(8, 4, 8, 4, 64);
    const exactness none = measure_exactness(untouched, 0, 512);
    CHECK_EQ(none.step_rows, 0);
    CHECK(!none.batching);
    CHECK(untouched.batch_sizes().empty());
}

TEST("one slot: the widths are measured in turn, and batching is not claimed") {
    fake_engine last(8, 4, 8, 1, 64);
    const exactness found = measure_exactness(last, 8, 512);
    CHECK_EQ(found.step_rows, 8);
    CHECK(!found.batching);
    CHECK(found.detail.find("one slot") != std::string::npos);
}

TEST_MAIN()
