// reference-generate.cpp - the unsplit model through plain llama.cpp (no range hooks):
// greedy or positional-seed sampling of N tokens after given prompt token ids, printed
// as JSON. The route tests compare split routes against it; the benchmark times it.
//
//   meshnet-reference-generate --model F --prompt-tokens 1,2,3 [-n 64] [--threads N]
//       [--batch N] [--gpu-layers N] [--temperature T --top-k K --top-p P --seed S]
#include "cpu_backend.h"
#include "sampling.h"

#include <llama.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static std::vector<int32_t> parse_ids(const std::string & text) {
    std::vector<int32_t> ids;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find(',', start);
        if (end == std::string::npos) end = text.size();
        ids.push_back(std::atoi(text.substr(start, end - start).c_str()));
        start = end + 1;
    }
    return ids;
}

int main(int argc, char ** argv) {
    std::string model_path;
    std::vector<int32_t> prompt;
    int n_predict = 64, n_threads = 2, n_batch = 512, n_gpu_layers = 0;
    meshnet::sampling_params sampling;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i], value = argv[i + 1];
        if (flag == "--model") model_path = value;
        else if (flag == "--prompt-tokens") prompt = parse_ids(value);
        else if (flag == "-n") n_predict = std::atoi(value.c_str());
        else if (flag == "--threads") n_threads = std::atoi(value.c_str());
        else if (flag == "--batch") n_batch = std::atoi(value.c_str());
        else if (flag == "--gpu-layers") n_gpu_layers = std::atoi(value.c_str());
        else if (flag == "--temperature") sampling.temperature = std::strtof(value.c_str(), nullptr);
        else if (flag == "--top-k") sampling.top_k = std::atoi(value.c_str());
        else if (flag == "--top-p") sampling.top_p = std::strtof(value.c_str(), nullptr);
        else if (flag == "--seed") sampling.seed = std::strtoull(value.c_str(), nullptr, 10);
        else { std::fprintf(stderr, "unknown flag %s\n", flag.c_str()); return 2; }
    }
    if (model_path.empty() || prompt.empty()) {
        std::fprintf(stderr, "usage: %s --model F --prompt-tokens 1,2,3 [-n N] [--threads N]\n", argv[0]);
        return 2;
    }
    std::string error;
    if (!meshnet::backends_init(error)) { std::fprintf(stderr, "error: %s\n", error.c_str()); return 1; }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model_params mparams = llama_model_default_params();
    mparams.use_extra_bufts = false; // AMX repacking crashes on hosts that do not enable AMX
    mparams.n_gpu_layers    = n_gpu_layers;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mparams);
    if (!model) { std::fprintf(stderr, "cannot load %s\n", model_path.c_str()); return 1; }
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = static_cast<uint32_t>(prompt.size() + n_predict + 8);
    cparams.n_batch         = static_cast<uint32_t>(n_batch);
    cparams.n_ubatch        = static_cast<uint32_t>(n_batch);
    cparams.n_threads       = n_threads;
    cparams.n_threads_batch = n_threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    std::vector<int32_t> out;
    int32_t position = 0;
    for (size_t start = 0; start < prompt.size(); start += static_cast<size_t>(n_batch)) {
        const size_t n = std::min(prompt.size() - start, static_cast<size_t>(n_batch));
        if (llama_decode(ctx, llama_batch_get_one(prompt.data() + start, static_cast<int32_t>(n))) != 0) {
            std::fprintf(stderr, "decode failed\n");
            return 1;
        }
        position += static_cast<int32_t>(n);
    }
    int32_t token = meshnet::sample_token(llama_get_logits_ith(ctx, -1), n_vocab, sampling, position - 1);
    const auto t1 = clock::now();
    out.push_back(token);
    while (static_cast<int>(out.size()) < n_predict) {
        if (llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0) {
            std::fprintf(stderr, "decode failed\n");
            return 1;
        }
        token = meshnet::sample_token(llama_get_logits_ith(ctx, -1), n_vocab, sampling, position);
        position++;
        out.push_back(token);
    }
    const auto t2 = clock::now();
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s  = std::chrono::duration<double>(t2 - t1).count();
    std::printf("{\"tokens\": [");
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? ", " : "", out[i]);
    std::printf("], \"prefill_seconds\": %.6f, \"decode_seconds\": %.6f, "
                "\"prefill_tokens_per_second\": %.2f, \"decode_tokens_per_second\": %.2f}\n",
                prefill_s, decode_s, prompt.size() / prefill_s, (out.size() - 1) / decode_s);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
