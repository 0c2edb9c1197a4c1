// test-deepseek4-dspark.cpp - a DSpark drafter GGUF on the last stage of a split deepseek4
// model (patch 0017; MESHNET_TEST_DS4_MODEL: the tiny 8-layer model, MESHNET_TEST_DS4_DSPARK_MODEL
// its tiny drafter reading layers 5-7, block 5): only the last stage holds it, the logits are
// the same with it on and off, and sessions sharing a step draft what each drafts alone.
#include "deepseek4_test.h"
#include "engine.h"
#include "hidden_rows.h"
#include "service_test.h"

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

constexpr int32_t N_PROMPT = 40;
constexpr int32_t N_TOKENS = 48;
constexpr int32_t K        = 4;

engine_ptr load(int32_t begin, int32_t end, bool drafting, int32_t k = K, std::string * error = nullptr) {
    engine_params params;
    params.model_path    = ds4_test::model("MESHNET_TEST_DS4_MODEL");
    params.layers        = {begin, end};
    params.n_ctx         = 256;
    params.n_slots       = 2;
    params.n_batch       = 64;
    params.n_threads     = 1;
    params.discard_depth = 8;
    if (drafting) {
        params.drafter       = drafter_kind::dspark;
        params.drafter_model = ds4_test::model("MESHNET_TEST_DS4_DSPARK_MODEL");
        params.drafter_k     = k;
    }
    std::string why;
    engine_ptr engine = llama_engine_init(params, why);
    if (error) {
        *error = why;
    }
    if (!engine && !error) {
        std::printf("  cannot load %d:%d: %s\n", begin, end, why.c_str());
    }
    return engine;
}

using ds4_test::route;

route split(bool drafting) {
    route r;
    r.stages.push_back(load(0, 3, false));
    r.stages.push_back(load(3, 5, false));
    r.stages.push_back(load(5, 8, drafting));
    return r;
}

int32_t greedy(const std::vector<float> & logits, size_t row, int32_t n_vocab) {
    return draft_argmax(logits.data() + row * static_cast<size_t>(n_vocab), n_vocab);
}

} // namespace

TEST("only the last stage holds the drafter's weights, and GetInfo's facts say what it added") {
    const engine_ptr plain = load(5, 8, false);
    const engine_ptr drafting = load(5, 8, true, 5);
    CHECK(plain && drafting);
    if (!plain || !drafting) return;
    const drafter_facts & drafter = drafting->info().drafter;
    CHECK(drafter.kind == drafter_kind::dspark && drafter.max_drafts == 5 && drafter.n_vocab == drafting->info().n_vocab);
    CHECK((drafter.target_layers == std::vector<int32_t>{5, 6, 7}));
    CHECK(drafter.weight_bytes > 0 && drafter.state_bytes > 0);
    const size_t added = drafting->info().weight_bytes - plain->info().weight_bytes;
    std::printf("  drafter weights %zu bytes (the stage grew by %zu), state %zu bytes; stage without it %zu bytes\n",
                drafter.weight_bytes, added, drafter.state_bytes, plain->info().weight_bytes);
    CHECK(added == drafter.weight_bytes);
    // it drafts from the sampled token and the tapped rows: no token ids beside the boundary
    CHECK(!drafting->info().needs_token_sideband);
    std::string error;
    CHECK(!load(0, 3, true, K, &error));
    CHECK(error.find("runs on the last stage") != std::string::npos);
    CHECK(!load(7, 8, true, K, &error));
    CHECK(error.find("reads the outputs of layers 5: this stage runs layers 7..7") != std::string::npos);
    CHECK(!load(5, 8, true, 6, &error));
    CHECK(error.find("at most 5 tokens per window") != std::string::npos);
    // the input of layer 6 is the boundary a stage 6:8 takes: it has layer 5's output
    CHECK(load(6, 8, true));
}

TEST("the logits are the same bits with the drafter on and off, and the split drafts what the unsplit model drafts") {
    route on  = split(true);
    route off = split(false);
    engine_ptr whole = load(0, -1, true);
    CHECK(whole && whole->info().drafter.kind == drafter_kind::dspark);
    if (!whole) return;
    const int32_t n_vocab = on.last().info().n_vocab;
    const std::vector<int32_t> prompt = ds4_test::tokens(N_PROMPT, 5);
    std::vector<float> logits = on.step(1, prompt, 0);
    CHECK(!logits.empty() && off.step(1, prompt, 0) == logits);
    CHECK(ds4_test::run(*whole, ds4_test::token_step(1, prompt, 0)).logits == logits);
    int32_t pos = N_PROMPT;
    int32_t token = greedy(logits, N_PROMPT - 1, n_vocab);
    int32_t drafted = 0, accepted = 0, windows = 0;
    std::set<int32_t> distinct; // what it proposed: tokens of the vocabulary, not one noise id
    double draft_ms = 0;
    on.last_ms  = 0;
    off.last_ms = 0;
    while (pos < N_PROMPT + N_TOKENS) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<int32_t> drafts = on.last().draft(1, pos, token, K);
        draft_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        CHECK(drafts.size() == static_cast<size_t>(K));
        // a repeated pass over the same history drafts the same, and so does the unsplit model
        CHECK(on.last().draft(1, pos, token, K) == drafts);
        CHECK(whole->draft(1, pos, token, K) == drafts);
        distinct.insert(drafts.begin(), drafts.end());
        std::vector<int32_t> window = {token};
        window.insert(window.end(), drafts.begin(), drafts.end());
        logits = on.step(1, window, pos);
        CHECK(!logits.empty() && off.step(1, window, pos) == logits);
        CHECK(ds4_test::run(*whole, ds4_test::token_step(1, window, pos)).logits == logits);
        ++windows;
        size_t kept = 0;
        int32_t next = greedy(logits, 0, n_vocab);
        while (kept < drafts.size() && next == drafts[kept]) {
            ++kept;
            next = greedy(logits, kept, n_vocab);
        }
        drafted += static_cast<int32_t>(drafts.size());
        accepted += static_cast<int32_t>(kept);
        const int32_t keep_to = pos + 1 + static_cast<int32_t>(kept);
        if (kept < drafts.size()) {
            for (route * r : {&on, &off}) {
                for (auto & stage : r->stages) {
                    CHECK(stage->slot_discard(1, keep_to).status == discard_status::done);
                }
            }
            CHECK(whole->slot_discard(1, keep_to).status == discard_status::done);
        }
        pos = keep_to;
        token = next;
    }
    CHECK(distinct.size() > 10);
    std::printf("  %zu distinct tokens drafted\n", distinct.size());
    const double step_ms = off.last_ms / windows, catch_up_ms = (on.last_ms - off.last_ms) / windows;
    std::printf("  %d windows: %d of %d drafts accepted (%.2f); the last stage per window of %d rows: its verify "
                "step %.2f ms without the drafter, the drafter's intake of the tapped rows %.2f ms, drafting "
                "%.2f ms: the drafter adds %.0f%% to the step\n",
                windows, accepted, drafted, drafted ? static_cast<double>(accepted) / drafted : 0.0, K + 1, step_ms,
                catch_up_ms, draft_ms / windows, 100.0 * (catch_up_ms + draft_ms / windows) / step_ms);
}

TEST("sessions that share an engine step draft what each drafts alone") {
    engine_ptr together = load(5, 8, true);
    engine_ptr alone = load(5, 8, true);
    engine_ptr first = load(0, 5, false);
    CHECK(together && alone && first);
    if (!together || !alone || !first) return;
    const std::vector<int32_t> a = ds4_test::tokens(12, 7), b = ds4_test::tokens(9, 8);
    const step_result ra = ds4_test::run(*first, ds4_test::token_step(0, a, 0));
    const step_result rb = ds4_test::run(*first, ds4_test::token_step(1, b, 0));
    step_request sa = ds4_test::token_step(0, a, 0), sb = ds4_test::token_step(1, b, 0);
    sa.boundary = ra.boundary;
    sb.boundary = rb.boundary;
    // slot 1 first in the step: the tapped rows are taken by each session's own batch rows
    const std::vector<step_result> both = together->step({sb, sa});
    CHECK(both.size() == 2 && both[0].status == engine_status::ok && both[1].status == engine_status::ok);
    CHECK(ds4_test::run(*alone, sa).status == engine_status::ok);
    CHECK(ds4_test::run(*alone, sb).status == engine_status::ok);
    const std::vector<int32_t> da = together->draft(0, 12, 40, K), db = together->draft(1, 9, 41, K);
    CHECK(da.size() == static_cast<size_t>(K) && db.size() == static_cast<size_t>(K));
    CHECK(da == alone->draft(0, 12, 40, K) && db == alone->draft(1, 9, 41, K));
    // a cleared slot, or a position past what it holds, drafts nothing
    together->slot_clear(0);
    CHECK(together->draft(0, 12, 40, K).empty() && together->draft(1, 30, 41, K).empty());
    CHECK(together->draft(1, 9, 41, 0).empty());
}

int main(int argc, char ** argv) {
    if (ds4_test::model("MESHNET_TEST_DS4_MODEL").empty()) {
        std::printf("MESHNET_TEST_DS4_MODEL is not set: skipped\n");
        return 77;
    }
    return ds4_test::main(argc, argv, "MESHNET_TEST_DS4_DSPARK_MODEL");
}
