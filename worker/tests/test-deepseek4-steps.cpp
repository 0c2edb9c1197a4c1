// test-deepseek4-steps.cpp - step invariance on deepseek4 (CPU): a step of n rows (1..8, a
// speculative verify window) gives, row for row, the bits the same rows give one at a time,
// on a first stage (its boundary) and a last stage (its logits), and leaves the same state
// (every later window is compared too). Two sessions march side by side over every position
// up to past the second HCA block, one in windows, the other one row at a time; windows
// straddle the sliding window's edge and the ratio-128 blocks, and every offset in a ratio-4
// block starts one. Patches 0011 and 0012 made it hold: F32 products of a few columns went
// to tinyBLAS, and a lone row's flash attention was split over the threads.
#include "deepseek4_test.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

struct window {
    int32_t pos0;
    int32_t n;
};

// Windows over [start, end): widths 1..8 in turn, and an 8-row window over each of `edges`
// (starting 4 before it), so each edge falls inside a step.
std::vector<window> plan(int32_t start, int32_t end, const std::vector<int32_t> & edges) {
    std::vector<window> out;
    int32_t pos = start;
    int32_t turn = 0;
    while (pos < end) {
        int32_t n = 1 + turn++ % 8;
        for (int32_t edge : edges) {
            if (edge - 4 > pos && edge - 4 < pos + n) {
                n = edge - 4 - pos; // stop short, so that the next window starts 4 before it
            } else if (edge - 4 == pos) {
                n = 8;
            }
        }
        n = std::min(n, end - pos);
        out.push_back({pos, n});
        pos += n;
    }
    return out;
}

// The stages of one route, two slots each: slot 0 takes a window as one step, slot 1 its rows
// one at a time. Counts the rows whose boundary or logits differ.
struct pipeline {
    std::vector<engine_ptr> stages;

    // runs `ids` at pos0 in `slot` through every stage; every row's output of each stage
    std::vector<std::vector<float>> step(int32_t slot, const std::vector<int32_t> & ids, int32_t pos0) {
        std::vector<std::vector<float>> outputs;
        std::vector<float> boundary;
        for (engine_ptr & stage : stages) {
            step_request request = ds4_test::token_step(slot, ids, pos0);
            if (!stage->info().is_first()) {
                request.boundary = boundary;
                if (!stage->info().needs_token_sideband) {
                    request.tokens.clear();
                }
            }
            const step_result result = ds4_test::run(*stage, request);
            CHECK(result.status == engine_status::ok);
            boundary = result.boundary;
            outputs.push_back(stage->info().is_last() ? result.logits : result.boundary);
        }
        return outputs;
    }

    // width of stage s's output per row
    size_t width(size_t s) const {
        const engine_info & info = stages[s]->info();
        return info.is_last() ? static_cast<size_t>(info.n_vocab) : static_cast<size_t>(info.boundary_row);
    }

    int32_t compare(const std::vector<window> & windows, const std::vector<int32_t> & ids) {
        int32_t differ = 0;
        for (const window & w : windows) {
            const std::vector<int32_t> rows(ids.begin() + w.pos0, ids.begin() + w.pos0 + w.n);
            const std::vector<std::vector<float>> together = step(0, rows, w.pos0);
            for (int32_t i = 0; i < w.n; ++i) {
                const std::vector<std::vector<float>> alone = step(1, {rows[static_cast<size_t>(i)]}, w.pos0 + i);
                for (size_t s = 0; s < stages.size(); ++s) {
                    if (ds4_test::row_of(together[s], width(s), static_cast<size_t>(i)) != alone[s]) {
                        if (differ++ < 3) {
                            std::printf("  stage %zu, position %d (row %d of %d) differs\n", s, w.pos0 + i, i, w.n);
                        }
                    }
                }
            }
        }
        return differ;
    }
};

pipeline split(const std::string & path, int32_t n_ctx, int32_t n_threads) {
    pipeline route;
    for (const auto & range : std::vector<std::pair<int32_t, int32_t>>{{0, 4}, {4, 8}}) {
        ds4_test::stage_params stage;
        stage.path      = path;
        stage.begin     = range.first;
        stage.end       = range.second;
        stage.n_ctx     = n_ctx;
        stage.n_threads = n_threads;
        route.stages.push_back(ds4_test::load(stage));
        CHECK(route.stages.back() != nullptr);
    }
    return route;
}

} // namespace

TEST("the window plan puts each edge inside an 8-row step and covers every position once") {
    const std::vector<window> windows = plan(0, 300, {16, 128, 256});
    int32_t next = 0;
    for (const window & w : windows) {
        CHECK(w.pos0 == next && w.n >= 1 && w.n <= 8);
        next += w.n;
    }
    CHECK(next == 300);
    for (int32_t edge : {16, 128, 256}) {
        CHECK(std::any_of(windows.begin(), windows.end(), [edge](const window & w) {
            return w.pos0 == edge - 4 && w.n == 8;
        }));
    }
}

TEST("a window of 1-8 rows computes as its rows one at a time, boundary and logits, up to 300 positions") {
    // indexer top-k 4 (it selects from position 16 on) and Q8_0 experts; two threads, so a lone
    // row's attention could be split over them
    pipeline route = split(ds4_test::model("MESHNET_TEST_DS4_SELECTING_MODEL"), 512, 2);
    if (route.stages.size() != 2 || !route.stages[0] || !route.stages[1]) {
        return;
    }
    const std::vector<int32_t> ids = ds4_test::tokens(300, 11);
    const int32_t differ = route.compare(plan(0, 300, {16, 128, 256}), ids);
    std::printf("  %d rows differ\n", differ);
    CHECK(differ == 0);
}

TEST("a window computes as its rows one at a time where a top-k of 512 selects (past 2048 positions)") {
    const std::string path = ds4_test::model("MESHNET_TEST_DS4_TOPK512_MODEL");
    if (path.empty()) {
        std::printf("  MESHNET_TEST_DS4_TOPK512_MODEL is not set: skipped\n");
        return;
    }
    ds4_test::stage_params whole;
    whole.path   = path;
    whole.n_ctx  = 2304;
    pipeline route;
    route.stages.push_back(ds4_test::load(whole));
    if (!route.stages[0]) {
        CHECK(false);
        return;
    }
    const int32_t start = 2032;
    const std::vector<int32_t> ids = ds4_test::tokens(2112, 12);
    const std::vector<int32_t> head(ids.begin(), ids.begin() + start);
    CHECK(ds4_test::prefill(*route.stages[0], 0, head, 0, whole.n_batch));
    CHECK(ds4_test::prefill(*route.stages[0], 1, head, 0, whole.n_batch));
    // 2048: the first position whose query sees more than 512 compressed rows, and an HCA block
    const int32_t differ = route.compare(plan(start, 2112, {2048, 2080}), ids);
    std::printf("  %d rows differ\n", differ);
    CHECK(differ == 0);
}

int main(int argc, char ** argv) {
    return ds4_test::main(argc, argv, "MESHNET_TEST_DS4_SELECTING_MODEL");
}
