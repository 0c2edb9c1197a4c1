// deepseek4_test.h - what the deepseek4 engine tests share: tiny models named by environment
// variables (written by `make test-cpp` with `python -m meshnet.devtools tiny-deepseek4`),
// loading a stage, token steps, and the main that skips when a model is missing.
#pragma once

#include "cpu_backend.h"
#include "engine.h"
#include "service_test.h"

#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ds4_test {

// MESHNET_TEST_DS4_MODEL: 8 layers, compress ratios 0,0,4,128,4,128,4,0, layers 0-2 hash-routed,
// a sliding window of 16, indexer top-k 2048 (never selects at test lengths).
// MESHNET_TEST_DS4_SELECTING_MODEL: the same shape with indexer top-k 4 (it selects from the
// 17th position on) and Q8_0 experts.
// MESHNET_TEST_DS4_TOPK512_MODEL: top-k 512, V4-Flash's index_topk (its config.json, which
// the pinned convert script writes as deepseek4.attention.indexer.top_k): it selects past
// 2048 positions.
inline std::string model(const char * variable) {
    const char * path = std::getenv(variable);
    return path ? path : "";
}

struct stage_params {
    std::string path;
    int32_t     begin         = 0;
    int32_t     end           = -1;
    int32_t     n_slots       = 2;
    int32_t     discard_depth = 0;
    int32_t     n_ctx         = 512;
    int32_t     n_batch       = 512;
    int32_t     n_threads     = 1;
};

// MESHNET_TEST_GPU_LAYERS: layers each stage offloads (a GPU lane's build runs the same
// tests on its device: `make test-cpp-vulkan`); unset, none.
inline int32_t gpu_layers() {
    const char * value = std::getenv("MESHNET_TEST_GPU_LAYERS");
    return value ? std::atoi(value) : 0;
}

inline meshnet::engine_ptr load(const stage_params & stage, std::string * error_out = nullptr) {
    meshnet::engine_params params;
    params.model_path    = stage.path;
    params.n_gpu_layers  = gpu_layers();
    params.layers = {stage.begin, stage.end};
    params.n_ctx         = stage.n_ctx;
    params.n_slots       = stage.n_slots;
    params.n_batch       = stage.n_batch;
    params.n_threads     = stage.n_threads;
    params.discard_depth = stage.discard_depth;
    std::string error;
    meshnet::engine_ptr engine = meshnet::llama_engine_init(params, error);
    if (!engine) {
        std::printf("  cannot load %s: %s\n", stage.path.c_str(), error.c_str());
    }
    if (error_out) {
        *error_out = error;
    }
    return engine;
}

// n pseudo-random ids of the byte and piece tokens (3..174), the same for the same seed
inline std::vector<int32_t> tokens(int32_t n, uint32_t seed) {
    std::vector<int32_t> out;
    uint32_t state = seed * 2654435761u + 12345u;
    for (int32_t i = 0; i < n; ++i) {
        state = state * 1103515245u + 12345u;
        out.push_back(3 + static_cast<int32_t>((state >> 8) % 170));
    }
    return out;
}

// a first-stage step of `ids` at pos0.. in `slot`, with logits of every row on a last stage
inline meshnet::step_request token_step(int32_t slot, const std::vector<int32_t> & ids, int32_t pos0) {
    meshnet::step_request request;
    request.slot   = slot;
    request.tokens = ids;
    for (size_t i = 0; i < ids.size(); ++i) {
        request.positions.push_back(pos0 + static_cast<int32_t>(i));
        request.output_rows.push_back(static_cast<int32_t>(i));
    }
    return request;
}

// one request alone in an engine step; the status is checked by the caller
inline meshnet::step_result run(meshnet::engine_i & engine, const meshnet::step_request & request) {
    return engine.step({request}).at(0);
}

// feeds `ids` at pos0.. in steps of at most n_batch rows (a prefill); false on any failure
inline bool prefill(meshnet::engine_i & engine, int32_t slot, const std::vector<int32_t> & ids, int32_t pos0,
                    int32_t n_batch) {
    for (size_t i = 0; i < ids.size(); i += static_cast<size_t>(n_batch)) {
        const size_t n = std::min(ids.size() - i, static_cast<size_t>(n_batch));
        const std::vector<int32_t> part(ids.begin() + static_cast<long>(i), ids.begin() + static_cast<long>(i + n));
        if (run(engine, token_step(slot, part, pos0 + static_cast<int32_t>(i))).status != meshnet::engine_status::ok) {
            return false;
        }
    }
    return true;
}

// row `row` of a step's output of `width` floats per row
inline std::vector<float> row_of(const std::vector<float> & values, size_t width, size_t row) {
    return std::vector<float>(values.begin() + static_cast<long>(row * width),
                              values.begin() + static_cast<long>((row + 1) * width));
}

// A route of engines, first to last, run one step at a time (the service's chain, without it).
struct route {
    std::vector<meshnet::engine_ptr> stages;
    double                  last_ms = 0; // the last stage's time in steps

    // the step's rows through every stage; the last stage's logits of every row
    std::vector<float> step(int32_t slot, const std::vector<int32_t> & tokens, int32_t pos0) {
        meshnet::step_request request = token_step(slot, tokens, pos0);
        for (size_t s = 0; s < stages.size(); ++s) {
            const auto started = std::chrono::steady_clock::now();
            const meshnet::step_result result = run(*stages[s], request);
            if (s + 1 == stages.size()) {
                last_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
            }
            if (result.status != meshnet::engine_status::ok) {
                std::printf("  stage %zu: %s\n", s, result.message.c_str());
                return {};
            }
            if (s + 1 == stages.size()) {
                return result.logits;
            }
            request.boundary = result.boundary;
            // as the service sends it: the token ids beside the boundary only where needed
            if (stages[s + 1]->info().needs_token_sideband) {
                request.tokens = tokens;
            } else {
                request.tokens.clear();
            }
        }
        return {};
    }

    meshnet::engine_i & last() { return *stages.back(); }
};

// quiet llama.cpp, start the backends, run the tests; 77 (skipped) without `required`'s model
inline int main(int argc, char ** argv, const char * required) {
    if (model(required).empty()) {
        std::printf("%s is not set: skipped\n", required);
        return 77;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    std::string error;
    if (!meshnet::backends_init(error)) { // MESHNET_CPU_VARIANT applies to the tests too
        std::fprintf(stderr, "%s\n", error.c_str());
        return 1;
    }
    return meshnet_test::run_all(argc, argv);
}

// Decodes `tokens` at pos0.. in sequence 0 of a raw llama.cpp context (no engine), with the
// last row's logits; llama_process's code.
inline int32_t decode_raw(llama_context * ctx, const std::vector<int32_t> & tokens, int32_t pos0) {
    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    for (size_t i = 0; i < tokens.size(); ++i) {
        const int32_t index = llama_batch_ext_add_token(batch, 0, tokens[i]);
        const llama_pos pos = pos0 + static_cast<int32_t>(i);
        llama_batch_ext_set_pos(batch, index, &pos);
        llama_batch_ext_set_output_logits(batch, index, i + 1 == tokens.size());
    }
    const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
    llama_batch_ext_free(batch);
    return rc;
}

} // namespace ds4_test
