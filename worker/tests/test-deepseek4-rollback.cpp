// test-deepseek4-rollback.cpp - speculative decoding's discards on deepseek4 (--discard-depth,
// patch 0010): a session that ran verify windows as separate steps and dropped the rejected
// positions, back into its first window, goes on exactly as a session that never saw them,
// across ratio-4 and ratio-128 block boundaries and past the sliding window (also where the
// window's cache wraps around); a discard deeper than the snapshots written since the last
// one, or a second one before a step, is refused with the session untouched; and what the
// snapshots cost per slot.
#include "deepseek4_test.h"

#include "slot_memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

std::string selecting() {
    return ds4_test::model("MESHNET_TEST_DS4_SELECTING_MODEL");
}

// Slot 0 speculates: k windows of w rows as k steps, then drops all but the first `accept`
// rows. Slot 1 never sees a dropped row: it runs the accepted rows as one step. The rows both
// computed on the same history are compared: the accepted rows of slot 0's first window (run
// right after the previous discard, restoring the snapshot) against slot 1's step.
struct speculation {
    engine_i & engine;
    int32_t    pos = 0;
    int32_t    differ = 0;
    int32_t    rounds = 0;

    void round(int32_t w, int32_t k, int32_t accept, uint32_t seed) {
        const std::vector<int32_t> ids = ds4_test::tokens(w * k, seed);
        std::vector<float> first;
        for (int32_t i = 0; i < k; ++i) {
            const std::vector<int32_t> part(ids.begin() + i * w, ids.begin() + (i + 1) * w);
            const step_result out = ds4_test::run(engine, ds4_test::token_step(0, part, pos + i * w));
            CHECK(out.status == engine_status::ok);
            if (i == 0) {
                first = out.logits;
            }
        }
        const discard_result dropped = engine.slot_discard(0, pos + accept);
        CHECK(dropped.status == discard_status::done);
        CHECK_EQ(engine.slot_n_past(0), pos + accept);

        const std::vector<int32_t> kept(ids.begin(), ids.begin() + accept);
        const step_result never = ds4_test::run(engine, ds4_test::token_step(1, kept, pos));
        CHECK(never.status == engine_status::ok);
        const size_t n_vocab = static_cast<size_t>(engine.info().n_vocab);
        for (int32_t i = 0; i < accept; ++i) {
            if (ds4_test::row_of(first, n_vocab, static_cast<size_t>(i)) !=
                ds4_test::row_of(never.logits, n_vocab, static_cast<size_t>(i))) {
                if (differ++ < 3) {
                    std::printf("  position %d differs (round %d: %d x %d rows, %d kept)\n", pos + i, rounds, k, w,
                                accept);
                }
            }
        }
        pos += accept;
        ++rounds;
    }
};

// Rounds until `end`: windows of (rows, count) in turn, 15 positions in flight at most, each
// keeping a different share of its first window (all of it: only later windows dropped).
int32_t march(engine_i & engine, int32_t prefix, int32_t end) {
    const std::vector<int32_t> head = ds4_test::tokens(prefix, 1);
    CHECK(ds4_test::prefill(engine, 0, head, 0, prefix));
    CHECK(ds4_test::prefill(engine, 1, head, 0, prefix));
    const std::vector<std::pair<int32_t, int32_t>> shapes = {{8, 2}, {5, 3}, {4, 3}, {1, 6}, {8, 1}, {3, 5}};
    speculation spec{engine, prefix};
    for (uint32_t seed = 100; spec.pos < end; ++seed) {
        const auto & shape = shapes[seed % shapes.size()];
        const int32_t accept = 1 + static_cast<int32_t>(seed * 7 % static_cast<uint32_t>(shape.first));
        spec.round(shape.first, shape.second, accept, seed);
    }
    std::printf("  %d rounds to position %d, %d rows differ\n", spec.rounds, spec.pos, spec.differ);
    return spec.differ;
}

} // namespace

TEST("discards back into the first of several windows go on exactly, across blocks and the window") {
    ds4_test::stage_params stage;
    stage.path          = selecting();
    stage.discard_depth = 15;
    engine_ptr engine = ds4_test::load(stage);
    if (!engine) {
        CHECK(false);
        return;
    }
    CHECK(engine->info().can_discard && engine->info().discard_depth == 15);
    // positions 20..300: the ratio-4 blocks, HCA blocks at 128 and 256, the 16-row window
    CHECK(march(*engine, 20, 300) == 0);
}

TEST("discards go on exactly where the sliding window's cache wraps around") {
    ds4_test::stage_params stage;
    stage.path          = selecting();
    stage.discard_depth = 15;
    stage.n_ctx         = 1024;
    stage.n_batch       = 64; // the window's cache holds 256 cells (16 + 64, padded)
    engine_ptr engine = ds4_test::load(stage);
    if (!engine) {
        CHECK(false);
        return;
    }
    CHECK(march(*engine, 64, 600) == 0);
}

TEST("sessions restoring in one shared decode step each get their own snapshots") {
    // slots 0 and 1 speculate, 2 and 3 never see a dropped row; decode steps of one token are
    // shared (the scheduler batches them), multi-token windows run alone
    ds4_test::stage_params stage;
    stage.path          = selecting();
    stage.discard_depth = 15;
    stage.n_slots       = 4;
    engine_ptr engine = ds4_test::load(stage);
    if (!engine) {
        CHECK(false);
        return;
    }
    const std::vector<int32_t> head = ds4_test::tokens(120, 21);
    for (int32_t slot = 0; slot < 4; ++slot) {
        CHECK(ds4_test::run(*engine, ds4_test::token_step(slot, head, 0)).status == engine_status::ok);
    }
    int32_t pos = 120;
    int32_t differ = 0;
    for (uint32_t round = 0; round < 6; ++round) {
        // two windows of 8 rows in slot 0 and of 5 in slot 1, then each keeps `keep` rows
        const std::vector<int32_t> ids = ds4_test::tokens(16, 30 + round);
        const int32_t keep = 1 + static_cast<int32_t>(round % 4);
        for (int32_t slot : {0, 1}) {
            const int32_t w = slot == 0 ? 8 : 5;
            for (int32_t i = 0; i < 2; ++i) {
                const std::vector<int32_t> part(ids.begin() + i * w, ids.begin() + (i + 1) * w);
                CHECK(ds4_test::run(*engine, ds4_test::token_step(slot, part, pos + i * w)).status == engine_status::ok);
            }
            CHECK(engine->slot_discard(slot, pos + keep).status == discard_status::done);
        }
        const std::vector<int32_t> kept(ids.begin(), ids.begin() + keep);
        for (int32_t slot : {2, 3}) {
            CHECK(ds4_test::run(*engine, ds4_test::token_step(slot, kept, pos)).status == engine_status::ok);
        }
        // one shared step restores both speculating slots; the references share one too
        const int32_t next = ids[15];
        const std::vector<step_result> spec = engine->step({ds4_test::token_step(0, {next}, pos + keep),
                                                            ds4_test::token_step(1, {next}, pos + keep)});
        const std::vector<step_result> never = engine->step({ds4_test::token_step(2, {next}, pos + keep),
                                                             ds4_test::token_step(3, {next}, pos + keep)});
        for (size_t i = 0; i < 2; ++i) {
            CHECK(spec[i].status == engine_status::ok && never[i].status == engine_status::ok);
            differ += spec[i].logits != never[i].logits;
        }
        pos += keep + 1;
    }
    std::printf("  %d of 12 restored rows differ\n", differ);
    CHECK(differ == 0);
}

TEST("a discard deeper than the snapshots, or a second before a step, is refused and changes nothing") {
    ds4_test::stage_params stage;
    stage.path          = selecting();
    stage.discard_depth = 7;
    engine_ptr engine = ds4_test::load(stage);
    if (!engine) {
        CHECK(false);
        return;
    }
    const std::vector<int32_t> ids = ds4_test::tokens(40, 5);
    const auto rows = [&](int32_t from, int32_t to) { return std::vector<int32_t>(ids.begin() + from, ids.begin() + to); };
    for (int32_t slot : {0, 1}) {
        CHECK(ds4_test::run(*engine, ds4_test::token_step(slot, rows(0, 20), 0)).status == engine_status::ok);
    }
    // two windows of 8: the snapshots reach 7 positions back
    CHECK(ds4_test::run(*engine, ds4_test::token_step(0, rows(20, 28), 20)).status == engine_status::ok);
    CHECK(ds4_test::run(*engine, ds4_test::token_step(0, rows(28, 36), 28)).status == engine_status::ok);
    discard_result refused = engine->slot_discard(0, 28);
    CHECK(refused.status == discard_status::too_deep && refused.restorable == 7);
    CHECK_EQ(engine->slot_n_past(0), 36);
    CHECK(engine->slot_discard(0, 29).status == discard_status::done);
    // a second discard before a step: nothing to restore from
    refused = engine->slot_discard(0, 28);
    CHECK(refused.status == discard_status::too_deep && refused.restorable == 0);
    CHECK_EQ(engine->slot_n_past(0), 29);
    // the refusals changed nothing: slot 0 goes on as slot 1, which never held 29..35
    CHECK(ds4_test::run(*engine, ds4_test::token_step(1, rows(20, 28), 20)).status == engine_status::ok);
    CHECK(ds4_test::run(*engine, ds4_test::token_step(1, rows(28, 29), 28)).status == engine_status::ok);
    const step_result a = ds4_test::run(*engine, ds4_test::token_step(0, rows(29, 31), 29));
    const step_result b = ds4_test::run(*engine, ds4_test::token_step(1, rows(29, 31), 29));
    CHECK(a.status == engine_status::ok && !a.logits.empty() && a.logits == b.logits);
    // after a step of 2 rows on the restored state: 2 positions back, not 3
    CHECK(engine->slot_discard(0, 28).status == discard_status::too_deep);
    CHECK(engine->slot_discard(0, 29).status == discard_status::done);
    // dropping everything is exact whatever is pending, and the slot starts afresh
    CHECK(engine->slot_discard(0, 0).status == discard_status::done);
    CHECK_EQ(engine->slot_n_past(0), 0);
    CHECK(ds4_test::run(*engine, ds4_test::token_step(0, rows(0, 3), 0)).status == engine_status::ok);
    CHECK(engine->slot_discard(0, 1).status == discard_status::done);
    CHECK_EQ(engine->slot_n_past(0), 1);
}

TEST("without --discard-depth deepseek4 cannot discard, and snapshots do not change a plain decode") {
    ds4_test::stage_params plain;
    plain.path = selecting();
    ds4_test::stage_params kept = plain;
    kept.discard_depth = 7;
    engine_ptr without = ds4_test::load(plain);
    engine_ptr with    = ds4_test::load(kept);
    if (!without || !with) {
        CHECK(false);
        return;
    }
    CHECK(!without->info().can_discard && without->info().discard_depth == 0);
    const std::vector<int32_t> ids = ds4_test::tokens(140, 9);
    CHECK(ds4_test::run(*without, ds4_test::token_step(0, ids, 0)).status == engine_status::ok);
    CHECK(without->slot_discard(0, 139).status == discard_status::unsupported);
    CHECK_EQ(without->slot_n_past(0), 140);
    CHECK(ds4_test::run(*with, ds4_test::token_step(0, ids, 0)).status == engine_status::ok);
    const std::vector<int32_t> next = ds4_test::tokens(3, 10);
    const step_result a = ds4_test::run(*without, ds4_test::token_step(0, next, 140));
    const step_result b = ds4_test::run(*with, ds4_test::token_step(0, next, 140));
    CHECK(a.status == engine_status::ok && !a.logits.empty() && a.logits == b.logits);
}

TEST("what the snapshots cost per slot: measured, and all of the memory they add") {
    for (const std::string & path : {selecting(), ds4_test::model("MESHNET_TEST_DS4_MODEL")}) {
        if (path.empty()) {
            continue;
        }
        ds4_test::stage_params stage;
        stage.path    = path;
        stage.n_slots = 2;
        const engine_ptr none = ds4_test::load(stage);
        CHECK(none != nullptr && none->info().discard_bytes == 0);
        size_t per_plane = 0;
        for (int32_t depth : {7, 15}) {
            stage.discard_depth = depth;
            const engine_ptr engine = ds4_test::load(stage);
            if (!engine || !none) {
                CHECK(false);
                continue;
            }
            const size_t bytes = engine->info().discard_bytes;
            const size_t added = (engine->info().kv_bytes - none->info().kv_bytes) / 2;
            std::printf("  %s, depth %d: %zu bytes of snapshots per slot (KV and state %zu per slot without)\n",
                        path.substr(path.find_last_of('/') + 1).c_str(), depth, bytes, none->info().kv_bytes / 2);
            CHECK(bytes > 0 && bytes == added);
            CHECK(bytes % static_cast<size_t>(depth) == 0);
            per_plane = per_plane == 0 ? bytes / 7 : per_plane;
            CHECK(bytes == per_plane * static_cast<size_t>(depth));
        }
    }
}

// a raw one-slot llama.cpp context with 7 snapshots, and decoding into it
struct raw_context {
    llama_model *   model = nullptr;
    llama_context * ctx   = nullptr;

    raw_context() {
        llama_model_params mparams = llama_model_default_params();
        mparams.load_mode       = LLAMA_LOAD_MODE_NONE;
        mparams.use_extra_bufts = false;
        model = llama_model_load_from_file(selecting().c_str(), mparams);
        llama_context_params cparams = llama_context_default_params();
        cparams.n_ctx     = 512;
        cparams.n_seq_max = 1;
        cparams.n_batch   = 512;
        cparams.n_ubatch  = 512;
        cparams.n_threads = cparams.n_threads_batch = 1;
        cparams.n_rs_seq  = 7;
        ctx = model ? llama_init_from_model(model, cparams) : nullptr;
    }
    ~raw_context() {
        llama_free(ctx);
        llama_model_free(model);
    }
    raw_context(const raw_context &) = delete;
    raw_context & operator=(const raw_context &) = delete;

    int32_t decode(const std::vector<int32_t> & ids, int32_t pos0) { return ds4_test::decode_raw(ctx, ids, pos0); }
};

TEST("llama.cpp itself refuses a rollback deeper than the snapshots written since the last") {
    raw_context raw;
    CHECK(raw.ctx != nullptr);
    if (!raw.ctx) {
        return;
    }
    const std::vector<int32_t> ids = ds4_test::tokens(40, 4);
    llama_memory_t memory = llama_get_memory(raw.ctx);
    CHECK(raw.decode(std::vector<int32_t>(ids.begin(), ids.begin() + 30), 0) == 0);
    CHECK(!llama_memory_seq_rm(memory, 0, 22, -1)); // 8 > 7
    CHECK(llama_memory_seq_rm(memory, 0, 27, -1));  // 3, leaving 4 behind them
    CHECK(!llama_memory_seq_rm(memory, 0, 26, -1)); // a second before a step
    CHECK(raw.decode({ids[27]}, 27) == 0);          // 4 + 1
    CHECK(!llama_memory_seq_rm(memory, 0, 22, -1)); // 6 > 5 (n_rs_seq alone would allow it)
    CHECK(llama_memory_seq_rm(memory, 0, 23, -1));
    CHECK(llama_memory_seq_pos_max(memory, 0) == 22);
}

TEST("a step that fails after a discard leaves an empty slot, never a half-restored one") {
    raw_context raw;
    CHECK(raw.ctx != nullptr);
    if (!raw.ctx) {
        return;
    }
    llama_context * ctx = raw.ctx;
    const auto decode = [&](const std::vector<int32_t> & ids, int32_t pos0) { return raw.decode(ids, pos0); };
    const std::vector<int32_t> ids = ds4_test::tokens(140, 3);
    CHECK(decode(std::vector<int32_t>(ids.begin(), ids.begin() + 130), 0) == 0);
    llama_memory_t memory = llama_get_memory(ctx);
    CHECK(llama_memory_seq_rm(memory, 0, 126, -1)); // a pending restore of 4 positions
    // abort the next step's graph part-way: some layers restored and snapshotted, some not
    static int nodes_left = 0;
    nodes_left = 300;
    llama_set_abort_callback(ctx, [](void *) { return --nodes_left < 0; }, nullptr);
    const int32_t rc = decode(std::vector<int32_t>(ids.begin() + 126, ids.begin() + 131), 126);
    CHECK(rc == 2);
    llama_set_abort_callback(ctx, nullptr, nullptr);
    // llama.cpp dropped the failed step itself, through the snapshots the graph half wrote
    CHECK(!slot_rollback(memory, 0, 126, rc, /*drops_any_suffix =*/ false));
    CHECK(llama_memory_seq_pos_max(memory, 0) == -1);
    // codes that fail before the memory is touched keep the slot
    CHECK(decode(std::vector<int32_t>(ids.begin(), ids.begin() + 10), 0) == 0);
    CHECK(slot_rollback(memory, 0, 10, 1, false) && llama_memory_seq_pos_max(memory, 0) == 9);
}

TEST("a state saved with a discard pending is the state the discard restores") {
    // A drops 5 positions across the HCA block at 127 and saves its sequence before the step
    // that restores them; B loads that, C never saw the dropped positions: one token at a time,
    // all three go on with the same logits
    raw_context a, b, c;
    CHECK(a.ctx != nullptr && b.ctx != nullptr && c.ctx != nullptr);
    if (!a.ctx || !b.ctx || !c.ctx) {
        return;
    }
    const std::vector<int32_t> ids = ds4_test::tokens(130, 5);
    const std::vector<int32_t> next = ds4_test::tokens(12, 6);
    CHECK(a.decode(ids, 0) == 0);
    CHECK(llama_memory_seq_rm(llama_get_memory(a.ctx), 0, 125, -1));
    std::vector<uint8_t> saved(llama_state_seq_get_size(a.ctx, 0));
    CHECK(!saved.empty() && llama_state_seq_get_data(a.ctx, saved.data(), saved.size(), 0) == saved.size());
    CHECK(llama_state_seq_set_data(b.ctx, saved.data(), saved.size(), 0) == saved.size());
    CHECK(c.decode(std::vector<int32_t>(ids.begin(), ids.begin() + 125), 0) == 0);
    const size_t n_vocab = static_cast<size_t>(llama_vocab_n_tokens(llama_model_get_vocab(a.model)));
    int32_t differ = 0;
    for (size_t i = 0; i < next.size(); ++i) {
        const int32_t pos = 125 + static_cast<int32_t>(i);
        CHECK(a.decode({next[i]}, pos) == 0 && b.decode({next[i]}, pos) == 0 && c.decode({next[i]}, pos) == 0);
        const float * la = llama_get_logits_ith(a.ctx, -1);
        const float * lb = llama_get_logits_ith(b.ctx, -1);
        const float * lc = llama_get_logits_ith(c.ctx, -1);
        if (!la || !lb || !lc || !std::equal(la, la + n_vocab, lc) || !std::equal(lb, lb + n_vocab, lc)) {
            ++differ;
        }
    }
    CHECK_EQ(differ, 0);
}

int main(int argc, char ** argv) {
    return ds4_test::main(argc, argv, "MESHNET_TEST_DS4_SELECTING_MODEL");
}
