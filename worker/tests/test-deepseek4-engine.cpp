// test-deepseek4-engine.cpp - the llama engine and the patched llama.cpp on a tiny random
// deepseek4 GGUF (MESHNET_TEST_DS4_MODEL, written by `python -m meshnet.devtools
// tiny-deepseek4`: 8 layers, compress ratios 0,0,4,128,4,128,4,0, layers 0-2 hash-routed;
// skipped when unset): the hazards of splitting it, each refused or handled.
#include "cpu_backend.h"
#include "deepseek4_test.h"
#include "engine.h"
#include "service_test.h"
#include "slot_memory.h"

#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

constexpr int32_t N_PROMPT = 300; // past two HCA blocks of 128 and the 16-token window

std::string model_path() {
    const char * path = std::getenv("MESHNET_TEST_DS4_MODEL");
    return path ? path : "";
}

engine_ptr load(int32_t begin, int32_t end, int32_t n_slots = 1, std::string * error_out = nullptr) {
    engine_params params;
    params.model_path  = model_path();
    params.layers = {begin, end};
    params.n_ctx       = 512;
    params.n_slots     = n_slots;
    params.n_batch     = 512;
    params.n_threads   = 1;
    std::string error;
    engine_ptr engine = llama_engine_init(params, error);
    if (error_out) {
        *error_out = error;
    }
    return engine;
}

std::vector<int32_t> prompt_tokens(int32_t n) {
    std::vector<int32_t> tokens;
    for (int32_t i = 0; i < n; ++i) {
        tokens.push_back(3 + (i * 37) % 170); // ids of the byte and piece tokens (175 in all)
    }
    return tokens;
}

step_request step(int32_t slot, const std::vector<int32_t> & tokens, int32_t pos0) {
    step_request request;
    request.slot   = slot;
    request.tokens = tokens;
    for (size_t i = 0; i < tokens.size(); ++i) {
        request.positions.push_back(pos0 + static_cast<int32_t>(i));
    }
    return request;
}

// a raw llama.cpp model of the owned range (for what the engine never asks of it)
llama_model * load_raw(int32_t begin, int32_t end, bool load_mtp = false) {
    llama_model_params params = llama_model_default_params();
    params.layer_begin     = begin;
    params.layer_end       = end;
    params.load_mode       = LLAMA_LOAD_MODE_NONE;
    params.use_extra_bufts = false;
    params.load_mtp        = load_mtp;
    return llama_model_load_from_file(model_path().c_str(), params);
}

llama_context * context_raw(llama_model * model, uint32_t n_seq, bool unified) {
    llama_context_params params = llama_context_default_params();
    params.n_ctx      = 512 * n_seq;
    params.n_seq_max  = n_seq;
    params.kv_unified = unified;
    params.n_batch    = 512;
    params.n_ubatch   = 512;
    params.n_threads  = 1;
    params.n_threads_batch = 1;
    return llama_init_from_model(model, params);
}


std::vector<float> last_logits(llama_context * ctx) {
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    const float * row = llama_get_logits_ith(ctx, -1);
    return row ? std::vector<float>(row, row + n_vocab) : std::vector<float>();
}

} // namespace

TEST("every split point loads, stages without an indexer or compressed layer included") {
    // 0:2 and 7:8 hold sliding-window layers only, 3:4 one HCA layer (no indexer cache)
    for (const auto & range : std::vector<std::pair<int32_t, int32_t>>{{0, 2}, {3, 4}, {7, 8}, {2, 3}, {0, 8}}) {
        std::string error;
        engine_ptr engine = load(range.first, range.second, 1, &error);
        CHECK(engine != nullptr);
        if (!engine) {
            std::printf("  %d:%d: %s\n", range.first, range.second, error.c_str());
            continue;
        }
        CHECK(engine->info().schema == boundary_schema::mhc_residual);
        CHECK(engine->info().boundary_row == 4 * engine->info().n_embd);
    }
}

TEST("a stage without an indexer layer runs a long prompt (no SIGFPE in the Hadamard input)") {
    engine_ptr first = load(0, 3);
    engine_ptr hca   = load(3, 4);
    CHECK(first && hca);
    const std::vector<int32_t> tokens = prompt_tokens(N_PROMPT);
    std::vector<step_result> out = first->step({step(0, tokens, 0)});
    CHECK(out[0].status == engine_status::ok);
    step_request next = step(0, {}, 0);
    next.positions = step(0, tokens, 0).positions;
    next.boundary  = out[0].boundary;
    std::vector<step_result> after = hca->step({next});
    CHECK(after[0].status == engine_status::ok);
    CHECK(after[0].boundary.size() == out[0].boundary.size());
}

TEST("a stage owning hash-routed layers says so and refuses a step without token ids") {
    engine_ptr first  = load(0, 1);
    engine_ptr hashed = load(1, 4);
    engine_ptr plain  = load(3, 8);
    CHECK(first && hashed && plain);
    CHECK(!first->info().needs_token_sideband);
    CHECK(hashed->info().needs_token_sideband);
    CHECK(!plain->info().needs_token_sideband);

    const std::vector<int32_t> tokens = prompt_tokens(8);
    std::vector<step_result> out = first->step({step(0, tokens, 0)});
    step_request bare = step(0, {}, 0);
    bare.positions = step(0, tokens, 0).positions;
    bare.boundary  = out[0].boundary;
    std::vector<step_result> refused = hashed->step({bare});
    CHECK(refused[0].status == engine_status::invalid_argument);
    CHECK(refused[0].message.find("token id") != std::string::npos);
    CHECK(hashed->slot_n_past(0) == 0);

    bare.tokens = {1, 2, 99999, 4, 5, 6, 7, 8}; // an id outside the vocabulary would index tid2eid
    CHECK(hashed->step({bare})[0].status == engine_status::invalid_argument);

    bare.tokens = tokens;
    CHECK(hashed->step({bare})[0].status == engine_status::ok);
    CHECK(hashed->slot_n_past(0) == 8);
}

TEST("llama.cpp itself never runs hash-routed layers on missing token ids") {
    llama_model * model = load_raw(1, 8);
    CHECK(model != nullptr && llama_model_needs_token_ids(model));
    llama_context * ctx = context_raw(model, 1, false);
    CHECK(ctx != nullptr);
    const int32_t n_embd = llama_model_n_embd_inp(model);
    CHECK(n_embd == 4 * llama_model_n_embd(model));
    std::vector<float> row(static_cast<size_t>(n_embd), 0.5f);
    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    const int32_t index = llama_batch_ext_add_embd(batch, 0, {row.data(), 1, row.size()});
    const llama_pos pos = 0;
    llama_batch_ext_set_pos(batch, index, &pos);
    CHECK(llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) == -1);
    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
}

TEST("media (embedding) input into a first stage that is not the whole model is refused") {
    llama_model * model = load_raw(0, 4);
    CHECK(model != nullptr);
    llama_context * ctx = context_raw(model, 1, false);
    std::vector<float> row(static_cast<size_t>(llama_model_n_embd_inp(model)), 0.5f);
    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    const int32_t index = llama_batch_ext_add_embd(batch, 0, {row.data(), 1, row.size()});
    const llama_pos pos = 0;
    llama_batch_ext_set_pos(batch, index, &pos);
    CHECK(llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) == -1);
    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
}

TEST("MTP layers on a range that ends before the last layer are refused at load (patch 0016)") {
    llama_model * partial = load_raw(0, 4, /*load_mtp =*/ true);
    CHECK(partial == nullptr);
    llama_model_free(partial);
}

TEST("per-slot memory does not grow with the number of slots") {
    size_t one = 0;
    for (int32_t n_slots : {1, 2, 4}) {
        engine_ptr engine = load(2, 6, n_slots);
        CHECK(engine != nullptr);
        const size_t per_slot = engine->info().kv_bytes / static_cast<size_t>(n_slots);
        std::printf("  %d slot(s): %zu bytes of KV and compressor state, %zu per slot\n",
                    n_slots, engine->info().kv_bytes, per_slot);
        if (n_slots == 1) {
            one = per_slot;
        }
        CHECK(per_slot == one);
        CHECK(engine->info().kv_bytes % static_cast<size_t>(n_slots) == 0);
    }
    // what a unified context would cost: every per-sequence stream sized for all slots
    llama_model * model = load_raw(2, 6);
    llama_context * unified = context_raw(model, 4, true);
    const uint64_t unified_bytes = llama_memory_buffer_size(llama_get_memory(unified));
    std::printf("  4 slots in a unified context: %llu bytes\n", static_cast<unsigned long long>(unified_bytes));
    CHECK(unified_bytes > 4 * one);
    llama_free(unified);
    llama_model_free(model);
}

TEST("a step that fails after it touched the compressor state leaves an empty slot, never stale state") {
    llama_model * model = load_raw(0, 8);
    CHECK(model != nullptr);
    const std::vector<int32_t> tokens = prompt_tokens(N_PROMPT + 20);
    const std::vector<int32_t> head(tokens.begin(), tokens.begin() + N_PROMPT);
    const std::vector<int32_t> tail(tokens.begin() + N_PROMPT, tokens.end());

    llama_context * fresh = context_raw(model, 1, false);
    CHECK(ds4_test::decode_raw(fresh, tokens, 0) == 0);
    const std::vector<float> expected = last_logits(fresh);
    llama_free(fresh);

    llama_context * ctx = context_raw(model, 1, false);
    CHECK(ds4_test::decode_raw(ctx, head, 0) == 0);
    // abort the next step's graph part-way, after some of its nodes ran
    static int nodes_left = 0;
    nodes_left = 200;
    llama_set_abort_callback(ctx, [](void *) { return --nodes_left < 0; }, nullptr);
    const int32_t rc = ds4_test::decode_raw(ctx, tail, N_PROMPT);
    CHECK(rc == 2);
    llama_set_abort_callback(ctx, nullptr, nullptr);

    // deepseek4's memory cannot take back what the aborted graph wrote: the slot is cleared
    llama_memory_t memory = llama_get_memory(ctx);
    CHECK(!slot_rollback(memory, 0, N_PROMPT, rc, /*drops_any_suffix =*/ false));
    CHECK(llama_memory_seq_pos_max(memory, 0) == -1);

    // and computes as new: the same logits as a fresh context
    CHECK(ds4_test::decode_raw(ctx, tokens, 0) == 0);
    CHECK(last_logits(ctx) == expected);
    llama_free(ctx);
    llama_model_free(model);
}

TEST("slot_rollback clears a deepseek4 slot unless the step failed before the memory") {
    llama_model * model = load_raw(0, 8);
    llama_context * ctx = context_raw(model, 1, false);
    const std::vector<int32_t> tokens = prompt_tokens(N_PROMPT);
    CHECK(ds4_test::decode_raw(ctx, tokens, 0) == 0);
    llama_memory_t memory = llama_get_memory(ctx);
    // 1 (no room) and -1 (a refused batch) fail before the memory is touched
    CHECK(slot_rollback(memory, 0, N_PROMPT, 1, false) && llama_memory_seq_pos_max(memory, 0) + 1 == N_PROMPT);
    CHECK(slot_rollback(memory, 0, N_PROMPT, -1, false) && llama_memory_seq_pos_max(memory, 0) + 1 == N_PROMPT);
    CHECK(!slot_rollback(memory, 0, N_PROMPT - 10, -3, false));
    CHECK(llama_memory_seq_pos_max(memory, 0) == -1);
    llama_free(ctx);
    llama_model_free(model);
}

int main(int argc, char ** argv) {
    if (model_path().empty()) {
        std::printf("MESHNET_TEST_DS4_MODEL is not set: skipped\n");
        return 77;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    std::string backend_error;
    if (!meshnet::backends_init(backend_error)) { // MESHNET_CPU_VARIANT applies to the tests too
        std::fprintf(stderr, "%s\n", backend_error.c_str());
        return 1;
    }
    return meshnet_test::run_all(argc, argv);
}
