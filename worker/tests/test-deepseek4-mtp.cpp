// test-deepseek4-mtp.cpp - the MTP drafter on the last stage of a split deepseek4 model
// (patch 0016; MESHNET_TEST_DS4_MTP_MODEL: the tiny 8-layer model with one MTP block after
// layer 7, MESHNET_TEST_DS4_MODEL the same main weights without it): it loads only where the
// last layer is, leaves the logits as they were, and drafts what the unsplit model drafts.
#include "deepseek4_test.h"
#include "engine.h"
#include "hidden_rows.h"
#include "service_test.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

constexpr int32_t N_PROMPT = 40;
constexpr int32_t N_TOKENS = 24;

engine_ptr load(int32_t begin, int32_t end, drafter_kind drafter, int32_t k = 3,
                std::string * error = nullptr, const char * variable = "MESHNET_TEST_DS4_MTP_MODEL",
                int32_t discard_depth = 8) {
    engine_params params;
    params.model_path    = ds4_test::model(variable);
    params.layers = {begin, end};
    params.n_ctx         = 256;
    params.n_slots       = 2;
    params.n_batch       = 64;
    params.n_threads     = 1;
    params.discard_depth = discard_depth;
    params.drafter       = drafter;
    params.drafter_k     = k;
    std::string why;
    engine_ptr engine = llama_engine_init(params, why);
    if (error) {
        *error = why;
    }
    return engine;
}

using ds4_test::route;

route split(drafter_kind drafter) {
    route r;
    r.stages.push_back(load(0, 3, drafter_kind::none));
    r.stages.push_back(load(3, 5, drafter_kind::none));
    r.stages.push_back(load(5, 8, drafter));
    return r;
}

int32_t greedy(const std::vector<float> & logits, size_t row, int32_t n_vocab) {
    return draft_argmax(logits.data() + row * static_cast<size_t>(n_vocab), n_vocab);
}

} // namespace

TEST("the mtp drafter loads only on the stage that owns the last layer, of a model that has one") {
    std::string error;
    CHECK(!load(0, 3, drafter_kind::mtp, 3, &error));
    CHECK(error.find("only the stage owning it") != std::string::npos && error.find("not layers 0:3") != std::string::npos);
    std::printf("  %s\n", error.c_str());
    CHECK(!load(5, 8, drafter_kind::mtp, 3, &error, "MESHNET_TEST_DS4_MODEL"));
    CHECK(error.find("with 0 MTP layers") != std::string::npos);
    CHECK(!load(5, 8, drafter_kind::mtp, 8, &error));
    CHECK(error.find("1 to 7") != std::string::npos);
}

TEST("only the last stage holds the drafter's weights, and GetInfo's facts say what it added") {
    const engine_ptr plain = load(5, 8, drafter_kind::none);
    const engine_ptr drafting = load(5, 8, drafter_kind::mtp, 5);
    CHECK(plain && drafting);
    if (!plain || !drafting) return;
    const drafter_facts & drafter = drafting->info().drafter;
    CHECK(plain->info().drafter.kind == drafter_kind::none);
    CHECK(drafter.kind == drafter_kind::mtp && drafter.max_drafts == 5 && drafter.n_vocab == drafting->info().n_vocab);
    CHECK(drafter.target_layers == std::vector<int32_t>{7});
    CHECK(drafter.weight_bytes > 0 && drafter.state_bytes > 0);
    const size_t added = drafting->info().weight_bytes - plain->info().weight_bytes;
    std::printf("  drafter weights %zu bytes (the stage grew by %zu), state %zu bytes; stage without it %zu bytes\n",
                drafter.weight_bytes, added, drafter.state_bytes, plain->info().weight_bytes);
    CHECK(added == drafter.weight_bytes);
    // the drafter pairs rows with their tokens: the stage asks for the ids beside the boundary
    CHECK(drafting->info().needs_token_sideband && !plain->info().needs_token_sideband);
    const engine_ptr first = load(0, 3, drafter_kind::none);
    CHECK(first && first->info().drafter.kind == drafter_kind::none);
}

TEST("the last stage's logits are the same bits with the drafter on and off, and as unsplit") {
    route on  = split(drafter_kind::mtp);
    route off = split(drafter_kind::none);
    engine_ptr whole = load(0, -1, drafter_kind::none, 3, nullptr, "MESHNET_TEST_DS4_MODEL");
    const std::vector<int32_t> prompt = ds4_test::tokens(N_PROMPT, 3);
    const std::vector<float> a = on.step(0, prompt, 0);
    const std::vector<float> b = off.step(0, prompt, 0);
    const step_result c = ds4_test::run(*whole, ds4_test::token_step(0, prompt, 0));
    CHECK(!a.empty() && a == b && a == c.logits);
}

TEST("a split last stage drafts what the unsplit model drafts, through verify windows and discards") {
    route on = split(drafter_kind::mtp);
    route off = split(drafter_kind::none); // the same windows without the drafter: what its catch-up costs
    engine_ptr whole = load(0, -1, drafter_kind::mtp);
    CHECK(whole && whole->info().drafter.kind == drafter_kind::mtp);
    const int32_t n_vocab = whole->info().n_vocab;
    const std::vector<int32_t> prompt = ds4_test::tokens(N_PROMPT, 5);
    std::vector<float> split_logits = on.step(1, prompt, 0);
    CHECK(off.step(1, prompt, 0) == split_logits);
    step_result unsplit = ds4_test::run(*whole, ds4_test::token_step(1, prompt, 0));
    CHECK(split_logits == unsplit.logits);
    int32_t pos = N_PROMPT;
    int32_t token = greedy(split_logits, N_PROMPT - 1, n_vocab);
    int32_t drafted = 0, accepted = 0;
    double draft_ms = 0;
    on.last_ms  = 0;
    off.last_ms = 0;
    int32_t windows = 0;
    while (pos < N_PROMPT + N_TOKENS) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<int32_t> drafts = on.last().draft(1, pos, token, 3);
        draft_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        CHECK(drafts == whole->draft(1, pos, token, 3));
        CHECK(on.last().draft(1, pos, token, 2) == std::vector<int32_t>(drafts.begin(), drafts.begin() + 2));
        CHECK(drafts.size() == 3);
        // the verify window [token, drafts]: greedy keeps the drafts up to the first miss
        std::vector<int32_t> window = {token};
        window.insert(window.end(), drafts.begin(), drafts.end());
        split_logits = on.step(1, window, pos);
        CHECK(off.step(1, window, pos) == split_logits);
        unsplit = ds4_test::run(*whole, ds4_test::token_step(1, window, pos));
        CHECK(!split_logits.empty() && split_logits == unsplit.logits);
        ++windows;
        size_t kept = 0;
        int32_t next = greedy(split_logits, 0, n_vocab);
        while (kept < drafts.size() && next == drafts[kept]) {
            ++kept;
            next = greedy(split_logits, kept, n_vocab);
        }
        drafted += static_cast<int32_t>(drafts.size());
        accepted += static_cast<int32_t>(kept);
        const int32_t keep_to = pos + 1 + static_cast<int32_t>(kept);
        if (kept < drafts.size()) { // drop the rejected drafts on every stage, as the loop does
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
    const double step_ms = off.last_ms / windows, catch_up_ms = (on.last_ms - off.last_ms) / windows;
    std::printf("  %d windows: %d of %d drafts accepted (%.2f); the last stage per window of 4 rows: its verify "
                "step %.2f ms without the drafter, the MTP block's catch-up over the rows %.2f ms, drafting "
                "%.2f ms: the drafter adds %.0f%% to the step\n",
                windows, accepted, drafted, drafted ? static_cast<double>(accepted) / drafted : 0.0, step_ms,
                catch_up_ms, draft_ms / windows, 100.0 * (catch_up_ms + draft_ms / windows) / step_ms);
}

TEST("sessions that share an engine step draft what each drafts alone") {
    engine_ptr together = load(5, 8, drafter_kind::mtp);
    engine_ptr alone = load(5, 8, drafter_kind::mtp);
    engine_ptr first = load(0, 5, drafter_kind::none);
    const std::vector<int32_t> a = ds4_test::tokens(12, 7), b = ds4_test::tokens(9, 8);
    // the boundaries of both prompts, from a first stage of layers 0-4
    const step_result ra = ds4_test::run(*first, ds4_test::token_step(0, a, 0));
    const step_result rb = ds4_test::run(*first, ds4_test::token_step(1, b, 0));
    step_request sa = ds4_test::token_step(0, a, 0), sb = ds4_test::token_step(1, b, 0);
    sa.boundary = ra.boundary;
    sb.boundary = rb.boundary;
    const std::vector<step_result> both = together->step({sa, sb});
    CHECK(both.size() == 2 && both[0].status == engine_status::ok && both[1].status == engine_status::ok);
    CHECK(ds4_test::run(*alone, sa).status == engine_status::ok);
    CHECK(ds4_test::run(*alone, sb).status == engine_status::ok);
    const std::vector<int32_t> da = together->draft(0, 12, 40, 3), db = together->draft(1, 9, 41, 3);
    CHECK(da.size() == 3 && db.size() == 3);
    CHECK(da == alone->draft(0, 12, 40, 3) && db == alone->draft(1, 9, 41, 3));
    // a slot that was cleared, or a position whose row it never held, drafts nothing
    together->slot_clear(0);
    CHECK(together->draft(0, 12, 40, 3).empty() && together->draft(1, 30, 41, 3).empty());
    CHECK(together->draft(1, 9, 41, 0).empty()); // none asked for
}

TEST("drafts do not depend on how the prompt was cut into steps, steps longer than the rows kept included") {
    // K = 1 and no discard: the drafter keeps 4 rows per slot, fewer than a step of 8 brings,
    // yet every row of a step pairs with the token after it
    engine_ptr eights = load(0, -1, drafter_kind::mtp, 1, nullptr, "MESHNET_TEST_DS4_MTP_MODEL", 0);
    engine_ptr ones = load(0, -1, drafter_kind::mtp, 1, nullptr, "MESHNET_TEST_DS4_MTP_MODEL", 0);
    CHECK(eights && ones);
    if (!eights || !ones) return;
    const int32_t n_vocab = ones->info().n_vocab;
    const std::vector<int32_t> prompt = ds4_test::tokens(N_PROMPT, 9);
    std::vector<float> last;
    for (int32_t pos = 0; pos < N_PROMPT; pos += 8) { // rows of up to 8 compute as alone (0011-0013)
        const std::vector<int32_t> part(prompt.begin() + pos, prompt.begin() + pos + 8);
        CHECK(ds4_test::run(*eights, ds4_test::token_step(0, part, pos)).status == engine_status::ok);
    }
    for (int32_t pos = 0; pos < N_PROMPT; ++pos) {
        last = ds4_test::run(*ones, ds4_test::token_step(0, {prompt[static_cast<size_t>(pos)]}, pos)).logits;
    }
    int32_t token = greedy(last, 0, n_vocab);
    for (int32_t pos = N_PROMPT; pos < N_PROMPT + 12; ++pos) {
        const std::vector<int32_t> drafted = ones->draft(0, pos, token, 1);
        CHECK(drafted.size() == 1 && drafted == eights->draft(0, pos, token, 1));
        last = ds4_test::run(*ones, ds4_test::token_step(0, {token}, pos)).logits;
        CHECK(ds4_test::run(*eights, ds4_test::token_step(0, {token}, pos)).logits == last);
        token = greedy(last, 0, n_vocab);
    }
}

int main(int argc, char ** argv) {
    if (ds4_test::model("MESHNET_TEST_DS4_MODEL").empty()) {
        std::printf("MESHNET_TEST_DS4_MODEL is not set: skipped\n");
        return 77;
    }
    return ds4_test::main(argc, argv, "MESHNET_TEST_DS4_MTP_MODEL");
}
