// main.cpp - meshnet-shard-worker: serve one layer range of a GGUF model over gRPC
// (meshnet.shard.v1) until SIGINT/SIGTERM.
#include "cpu_backend.h"
#include "cuda_lane.h"
#include "engine.h"
#include "exactness_cache.h"
#include "exactness_probe.h"
#include "gguf_vocab.h"
#include "host_facts.h"
#include "worker_params.h"
#include "worker_server.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <sys/prctl.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace {

// Every variable that can choose ggml's kernels or devices (GGML_VK_VISIBLE_DEVICES,
// GGML_VK_DISABLE_FUSION, ..., the Vulkan loader's VK_DRIVER_FILES, MESHNET_VK_UPSTREAM_PATHS,
// MESHNET_CPU_VARIANT), as sorted name=value lines: a start under any other choice measures
// again.
std::string path_environment() {
    std::vector<std::string> chosen;
    for (char ** entry = environ; *entry != nullptr; ++entry) {
        const std::string line = *entry;
        if (line.rfind("GGML_", 0) == 0 || line.rfind("VK_", 0) == 0 || line.rfind("MESHNET_VK_", 0) == 0 || line.rfind("MESHNET_CPU_VARIANT=", 0) == 0) {
            chosen.push_back(line);
        }
    }
    std::sort(chosen.begin(), chosen.end());
    std::string joined;
    for (const std::string & line : chosen) {
        joined += line + "\n";
    }
    return joined;
}

// The start-up probe, or its result for exactly these inputs where MESHNET_EXACTNESS_CACHE
// keeps one (the binary, the weights, the device and every setting the probe reads).
meshnet::exactness measure_or_recall(const meshnet::worker_params & params, meshnet::engine_i & engine) {
    const std::string dir = meshnet::exactness_cache_dir();
    if (dir.empty()) {
        return meshnet::measure_exactness(engine, params.exact_batch_rows, params.n_batch);
    }
    const meshnet::engine_info & info = engine.info();
    const std::string key = meshnet::exactness_key({
        {"binary", meshnet::file_identity("/proc/self/exe")},
        {"model", meshnet::file_identity(params.model_path)},
        {"layers", std::to_string(info.layers.begin) + ":" + std::to_string(info.layers.end)},
        {"gpu_layers", std::to_string(params.n_gpu_layers)},
        {"threads", std::to_string(params.n_threads)},
        {"slots", std::to_string(info.n_slots)},
        {"ctx", std::to_string(info.n_ctx)},
        {"batch", std::to_string(params.n_batch)},
        {"exact_batch_rows", std::to_string(params.exact_batch_rows)},
        {"discard_depth", std::to_string(params.discard_depth)},
        {"drafter", std::string(meshnet::drafter_kind_name(params.drafter)) + " " + std::to_string(params.drafter_k) + " " + params.drafter_model},
        {"cpu_backend", meshnet::cpu_backend_describe()},
        {"environment", path_environment()},
    });
    if (auto recalled = meshnet::load_exactness(dir, key)) {
        recalled->detail += " (recalled from " + dir + ")";
        return *recalled;
    }
    meshnet::exactness measured = meshnet::measure_exactness(engine, params.exact_batch_rows, params.n_batch);
    meshnet::store_exactness(dir, key, measured);
    return measured;
}

} // namespace

int main(int argc, char ** argv) {
    meshnet::worker_params params;
    std::string error;
    meshnet::worker_action action = meshnet::worker_action::run;
    if (!meshnet::worker_params_parse(argc, argv, params, error, action)) {
        // --check-args callers want the reason alone; a person starting it, the usage too.
        if (action != meshnet::worker_action::check_args) {
            std::fputs(meshnet::worker_params_usage().c_str(), stderr);
            std::fputs("\n", stderr);
        }
        std::fprintf(stderr, "error: %s\n", error.c_str());
        return 2;
    }
    switch (action) {
        case meshnet::worker_action::help:
            std::fputs(meshnet::worker_params_usage().c_str(), stdout);
            return 0;
        case meshnet::worker_action::print_flags:
            std::fputs(meshnet::worker_flags_json().c_str(), stdout);
            return 0;
        case meshnet::worker_action::check_args:
            return 0;
        case meshnet::worker_action::run:
            break;
    }
    // A CUDA build without a driver, with one too old, or without a device: say so and stop.
    if (const std::string refusal = meshnet::cuda_lane_refusal(); !refusal.empty()) {
        std::fprintf(stderr, "error: %s\n", refusal.c_str());
        return 1;
    }

    // Block the stop signals before any thread starts so only sigwait below sees them.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    if (params.exit_with_parent > 0) {
        // SIGTERM (waited for below) once the parent exits; it may already have.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != static_cast<pid_t>(params.exit_with_parent)) {
            std::fprintf(stderr, "error: --exit-with-parent %lld: the parent is gone\n",
                         static_cast<long long>(params.exit_with_parent));
            return 1;
        }
    }

    // Before the engine's threads exist: binding them narrows the process's CPU mask.
    const meshnet::compute_placement placement = meshnet::read_placement(params.n_threads, params.n_gpu_layers);

    meshnet::engine_params engine_params;
    engine_params.model_path   = params.model_path;
    engine_params.layers       = params.layers;
    engine_params.n_ctx        = params.n_ctx;
    engine_params.n_slots      = params.n_slots;
    engine_params.n_batch      = params.n_batch;
    engine_params.n_threads    = params.n_threads;
    engine_params.n_gpu_layers = params.n_gpu_layers;
    engine_params.discard_depth = params.discard_depth;
    engine_params.drafter      = params.drafter;
    engine_params.drafter_k    = params.drafter_k;
    engine_params.drafter_model = params.drafter_model;
    meshnet::engine_ptr engine = meshnet::llama_engine_init(engine_params, error);
    if (!engine) {
        std::fprintf(stderr, "error: cannot load %s: %s\n", params.model_path.c_str(), error.c_str());
        return 1;
    }

    meshnet::gguf_vocab_facts vocab = meshnet::gguf_vocab_read(params.model_path);
    if (vocab.tokenize.token_bytes > 0) {
        std::fprintf(stderr, "meshnet-shard-worker: tokenize: text is refused untokenized past %lld counted bytes "
                     "(%lld per token, %d tokens of context)\n",
                     static_cast<long long>(vocab.tokenize.token_bytes * params.n_ctx),
                     static_cast<long long>(vocab.tokenize.token_bytes), params.n_ctx);
    } else {
        std::fprintf(stderr, "meshnet-shard-worker: tokenize: no byte bound for this tokenizer; text is "
                     "tokenized whole\n");
    }
    // Before it serves: what this engine computes exactly, on its own weights and device.
    meshnet::exactness measured = measure_or_recall(params, *engine);
    std::fprintf(stderr, "meshnet-shard-worker: exactness: exact_step_rows %d, exact_batching %s: %s (measured in "
                 "%lld ms)%s\n", measured.step_rows, measured.batching ? "true" : "false", measured.detail.c_str(),
                 static_cast<long long>(measured.probe_micros / 1000),
                 params.throughput_batching ? "; --batching throughput: sessions share steps as upstream batches, "
                                              "tokens may depend on the load" : "");
    meshnet::worker_server server;
    if (!server.start(params, *engine, error, std::move(vocab), placement, std::move(measured))) {
        std::fprintf(stderr, "error: %s\n", error.c_str());
        return 1;
    }
    const meshnet::engine_info & info = engine->info();
    std::fprintf(stderr, "meshnet-shard-worker: layers %d:%d of %d (%s), route %s epoch %llu, incarnation %s\n",
                 info.layers.begin, info.layers.end, info.n_layer, info.arch.c_str(), params.route_id.c_str(),
                 static_cast<unsigned long long>(params.epoch), server.incarnation().c_str());
    std::fprintf(stderr, "meshnet-shard-worker: cpu backend %s\n", meshnet::cpu_backend_describe().c_str());
    if (info.discard_depth > 0) {
        std::fprintf(stderr, "meshnet-shard-worker: discard depth %d: %zu bytes of state snapshots per slot "
                     "(%zu bytes of KV and state in all)\n", info.discard_depth, info.discard_bytes, info.kv_bytes);
    }
    if (info.drafter.kind != meshnet::drafter_kind::none) {
        std::fprintf(stderr, "meshnet-shard-worker: drafter %s, %d tokens per window: %zu bytes of weights, "
                     "%zu bytes of state\n", meshnet::drafter_kind_name(info.drafter.kind), info.drafter.max_drafts,
                     info.drafter.weight_bytes, info.drafter.state_bytes);
    }
    if (server.metrics_port() > 0) {
        std::fprintf(stderr, "meshnet-shard-worker: metrics on port %d\n", server.metrics_port());
    }
    std::fprintf(stderr, "meshnet-shard-worker: listening on port %d\n", server.port());
    std::fflush(stderr);

    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    std::fprintf(stderr, "meshnet-shard-worker: signal %d, shutting down\n", signal_number);
    server.stop(2000);
    return 0;
}
