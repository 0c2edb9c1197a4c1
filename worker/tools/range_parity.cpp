// range_parity.cpp - meshnet-range-parity: runs one prompt through a GGUF model unsplit and
// through each requested split into layer-range stages (boundaries passed in memory) and
// prints a JSON report: max |logit difference|, greedy token match, per-stage footprint.
//
// Exit status: 0 every split matches, 1 a split differs or failed, 2 refused input.
#include "boundary_codec.h"
#include "engine.h"
#include "gguf_facts.h"
#include "layer_range.h"

#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

const char * const default_prompt =
    "The history of mapmaking is a story of people trying to describe a world they could "
    "only see in pieces. Early charts recorded coastlines as sailors remembered them, with "
    "harbours, rocks and currents drawn from memory and rumour. Later surveyors measured "
    "angles and distances with chains and telescopes, and slowly the pieces fitted together. ";

struct options {
    std::string              model;
    std::vector<std::string> splits;
    std::string              prompt    = default_prompt;
    int32_t                  n_prompt  = 64;
    int32_t                  n_decode  = 32;
    int32_t                  n_threads = 0;
    int32_t                  n_gpu_layers = 0;
    double                   tolerance = 1e-4;
    float                    perturb   = 0.0f; // added to every boundary value (checker self-test)
    wire_dtype               boundary_dtype = wire_dtype::f32; // boundaries rounded as the wire would
    bool                     verbose   = false;
};

void print_usage(FILE * out) {
    std::fprintf(out,
        "usage: meshnet-range-parity --model PATH --split B:E,B:E[,...] [--split ...]\n"
        "                            [--prompt TEXT] [--n-prompt N] [--n-decode N]\n"
        "                            [--threads N] [--gpu-layers N] [--tolerance X] [--perturb X]\n"
        "                            [--boundary-dtype f32|f16|bf16] [--verbose]\n"
        "\n"
        "Runs the prompt (N prompt tokens, then greedy decode steps) through the unsplit model\n"
        "and through each split, passing boundaries between stages in memory, and prints JSON.\n"
        "A split passes when its greedy tokens equal the unsplit ones and every logit is within\n"
        "the tolerance (default 1e-4). Exit 0: all pass, 1: a split fails, 2: refused input.\n"
        "--perturb X adds X to every boundary value between stages, to show that the check\n"
        "catches a wrong boundary (the report must then fail). --gpu-layers N offloads the last\n"
        "N layers of the model (of each stage, the ones it owns) on a GPU build (default: 0).\n"
        "--boundary-dtype rounds every boundary to that wire type, as a route with that recipe\n"
        "does (default f32: exact). Each split's \"seams\" say what crossed each stage boundary.\n");
}

// --- JSON output ---------------------------------------------------------------------

std::string json_str(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"':  out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n";  break;
            case '\t': out += "\\t";  break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\u%04x", c);
                    out += buf;
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    return out + "\"";
}

std::string json_num(double x) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", x);
    return buf;
}

std::string json_ints(const std::vector<int32_t> & v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) {
        out += (i ? ", " : "") + std::to_string(v[i]);
    }
    return out + "]";
}

// --- input ---------------------------------------------------------------------------

[[noreturn]] void refuse(const std::string & message) {
    std::fprintf(stderr, "meshnet-range-parity: error: %s\n", message.c_str());
    std::printf("{\"ok\": false, \"error\": %s}\n", json_str(message).c_str());
    std::exit(2);
}

bool parse_int(const char * text, int32_t lo, int32_t hi, int32_t & out) {
    char * end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || value < lo || value > hi) {
        return false;
    }
    out = static_cast<int32_t>(value);
    return true;
}

options parse_args(int argc, char ** argv) {
    options opt;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            print_usage(stdout);
            std::exit(0);
        }
        if (arg == "--verbose") {
            opt.verbose = true;
            continue;
        }
        if (i + 1 >= argc) {
            refuse("unknown option or missing value: " + arg + " (see --help)");
        }
        const char * value = argv[++i];
        if (arg == "--model") {
            opt.model = value;
        } else if (arg == "--split") {
            opt.splits.emplace_back(value);
        } else if (arg == "--prompt") {
            opt.prompt = value;
        } else if (arg == "--n-prompt") {
            if (!parse_int(value, 1, 4096, opt.n_prompt)) refuse("--n-prompt needs an integer in 1..4096");
        } else if (arg == "--n-decode") {
            if (!parse_int(value, 0, 4096, opt.n_decode)) refuse("--n-decode needs an integer in 0..4096");
        } else if (arg == "--threads") {
            if (!parse_int(value, 0, 1024, opt.n_threads)) refuse("--threads needs an integer in 0..1024");
        } else if (arg == "--gpu-layers") {
            if (!parse_int(value, 0, 100000, opt.n_gpu_layers)) refuse("--gpu-layers needs an integer in 0..100000");
        } else if (arg == "--perturb") {
            char * end = nullptr;
            opt.perturb = std::strtof(value, &end);
            if (end == value || *end != '\0' || !std::isfinite(opt.perturb)) refuse("--perturb needs a finite number");
        } else if (arg == "--boundary-dtype") {
            if (!wire_dtype_parse(value, opt.boundary_dtype)) refuse("--boundary-dtype needs f32, f16 or bf16");
        } else if (arg == "--tolerance") {
            char * end = nullptr;
            opt.tolerance = std::strtod(value, &end);
            if (end == value || *end != '\0' || !(opt.tolerance >= 0.0)) refuse("--tolerance needs a number >= 0");
        } else {
            refuse("unknown option: " + arg + " (see --help)");
        }
    }
    if (opt.model.empty()) {
        refuse("--model is required (see --help)");
    }
    if (opt.splits.empty()) {
        refuse("at least one --split is required, e.g. --split 0:15,15:30");
    }
    return opt;
}

// --- running -------------------------------------------------------------------------

// everything one pipeline produced: greedy tokens (one after the prompt, then one per decode
// step) and the logits of every step (the prefill step has one row per prompt token)
struct run_record {
    std::vector<int32_t>            tokens;
    std::vector<std::vector<float>> logits;
};

int32_t argmax(const float * row, int32_t n) {
    return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// what the wire does to a boundary: encode in `dtype`, decode back to f32
bool wire_round_trip(std::vector<float> & values, wire_dtype dtype, std::string & error) {
    if (dtype == wire_dtype::f32) {
        return true;
    }
    std::string bytes;
    boundary_encode(values.data(), values.size(), dtype, bytes);
    std::vector<float> decoded;
    if (!boundary_decode(bytes, values.size(), dtype, decoded, error)) {
        return false;
    }
    values = std::move(decoded);
    return true;
}

// one step of every stage in turn, the boundary of one feeding the next (with the token ids
// beside it where a stage needs them)
bool pipeline_step(std::vector<engine_ptr> & stages, const std::vector<int32_t> & tokens, int32_t pos0,
                   bool all_rows, float perturb, wire_dtype dtype, std::vector<float> & logits, std::string & error) {
    step_request request;
    request.slot = 0;
    request.tokens = tokens;
    for (size_t i = 0; i < tokens.size(); ++i) {
        request.positions.push_back(pos0 + static_cast<int32_t>(i));
    }
    for (size_t s = 0; s < stages.size(); ++s) {
        const engine_info & info = stages[s]->info();
        if (info.is_last()) {
            for (size_t i = all_rows ? 0 : tokens.size() - 1; i < tokens.size(); ++i) {
                request.output_rows.push_back(static_cast<int32_t>(i));
            }
        }
        std::vector<step_result> results = stages[s]->step({request});
        step_result & result = results.at(0);
        if (result.status != engine_status::ok) {
            error = "stage " + info.layers.str() +
                    " failed at position " + std::to_string(pos0) + ": " + engine_status_name(result.status) +
                    (result.message.empty() ? "" : " (" + result.message + ")");
            return false;
        }
        if (info.is_last()) {
            logits = std::move(result.logits);
            return true;
        }
        request.boundary = std::move(result.boundary);
        for (float & value : request.boundary) {
            value += perturb;
        }
        if (!wire_round_trip(request.boundary, dtype, error)) {
            error = "the boundary after layer " + std::to_string(info.layers.end) + " cannot cross as " +
                    wire_dtype_name(dtype) + ": " + error;
            return false;
        }
        if (!stages[s + 1]->info().needs_token_sideband) {
            request.tokens.clear();
        }
    }
    error = "the split has no last stage";
    return false;
}

bool run_pipeline(std::vector<engine_ptr> & stages, const std::vector<int32_t> & prompt, int32_t n_decode,
                  float perturb, wire_dtype dtype, run_record & out, std::string & error) {
    const int32_t n_vocab = stages.back()->info().n_vocab;
    std::vector<float> logits;
    if (!pipeline_step(stages, prompt, 0, /*all_rows =*/ true, perturb, dtype, logits, error)) {
        return false;
    }
    int32_t token = argmax(logits.data() + logits.size() - static_cast<size_t>(n_vocab), n_vocab);
    out.logits.push_back(std::move(logits));
    out.tokens.push_back(token);
    for (int32_t step = 0; step < n_decode; ++step) {
        const int32_t pos = static_cast<int32_t>(prompt.size()) + step;
        if (!pipeline_step(stages, {token}, pos, false, perturb, dtype, logits, error)) {
            return false;
        }
        token = argmax(logits.data(), n_vocab);
        out.logits.push_back(std::move(logits));
        out.tokens.push_back(token);
    }
    return true;
}

engine_params stage_params(const options & opt, const layer_range & range, int32_t n_ctx) {
    engine_params params;
    params.model_path  = opt.model;
    params.layers = range;
    params.n_ctx       = n_ctx;
    params.n_slots     = 1;
    params.n_batch     = std::max<int32_t>(opt.n_prompt, 32);
    params.n_threads   = opt.n_threads;
    params.n_gpu_layers = opt.n_gpu_layers;
    return params;
}

const char * schema_name(boundary_schema schema) {
    return schema == boundary_schema::mhc_residual ? "MHC_RESIDUAL" : "DENSE_RESIDUAL";
}

// what crosses the seam after `from`: schema, row shape, wire type, bytes per token, sideband
std::string seam_json(const engine_info & from, const engine_info & to, wire_dtype dtype) {
    const int64_t hc = from.n_embd > 0 ? from.boundary_row / from.n_embd : 1;
    const std::string shape = from.schema == boundary_schema::mhc_residual
        ? "[" + std::to_string(hc) + ", " + std::to_string(from.n_embd) + "]"
        : "[" + std::to_string(from.boundary_row) + "]";
    const size_t bytes = static_cast<size_t>(from.boundary_row) * wire_dtype_size(dtype) +
                         (to.needs_token_sideband ? sizeof(int32_t) : 0);
    return "{\"after_layer\": " + std::to_string(from.layers.end) +
           ", \"schema\": " + json_str(schema_name(from.schema)) + ", \"row_shape\": " + shape +
           ", \"dtype\": " + json_str(wire_dtype_name(dtype)) +
           ", \"token_sideband\": " + (to.needs_token_sideband ? "true" : "false") +
           ", \"bytes_per_token\": " + std::to_string(bytes) + "}";
}

std::string stage_json(const engine_info & info) {
    return "{\"begin\": " + std::to_string(info.layers.begin) + ", \"end\": " + std::to_string(info.layers.end) +
           ", \"weight_bytes\": " + std::to_string(info.weight_bytes) +
           ", \"kv_bytes\": " + std::to_string(info.kv_bytes) + "}";
}

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

} // namespace

int main(int argc, char ** argv) {
    const options opt = parse_args(argc, argv);
    if (!opt.verbose) {
        llama_log_set(quiet_log, nullptr);
    }

    // refuse everything refusable before loading a single tensor
    gguf_facts facts;
    std::string error;
    if (!gguf_facts_read(opt.model, facts, error)) {
        refuse(error);
    }
    std::vector<std::vector<layer_range>> splits;
    for (const std::string & text : opt.splits) {
        std::vector<layer_range> split;
        if (!layer_split_parse(text, split, error)) {
            refuse(error);
        }
        const std::string problem = layer_split_check(split, facts.n_layer);
        if (!problem.empty()) {
            refuse(problem);
        }
        splits.push_back(std::move(split));
    }

    const int32_t n_ctx = opt.n_prompt + opt.n_decode + 1;

    std::vector<engine_ptr> reference;
    reference.push_back(llama_engine_init(stage_params(opt, {0, facts.n_layer}, n_ctx), error));
    if (!reference.back()) {
        refuse(error);
    }
    const engine_info reference_info = reference.back()->info();

    std::vector<int32_t> prompt;
    std::string text = opt.prompt;
    while (true) {
        if (reference.back()->tokenize(text, /*add_special =*/ true, /*literal =*/ {}, prompt) != engine_status::ok || prompt.empty()) {
            refuse("the prompt cannot be tokenized");
        }
        if (prompt.size() >= static_cast<size_t>(opt.n_prompt)) {
            break;
        }
        text += opt.prompt;
    }
    prompt.resize(static_cast<size_t>(opt.n_prompt));

    run_record expected;
    if (!run_pipeline(reference, prompt, opt.n_decode, 0.0f, wire_dtype::f32, expected, error)) {
        std::fprintf(stderr, "meshnet-range-parity: the unsplit model failed: %s\n", error.c_str());
        std::printf("{\"ok\": false, \"error\": %s}\n", json_str("the unsplit model failed: " + error).c_str());
        return 1;
    }
    reference.clear();

    bool all_ok = true;
    std::string splits_json;
    for (const std::vector<layer_range> & split : splits) {
        const auto started = std::chrono::steady_clock::now();
        std::string stages_json;
        std::string seams_json;
        std::string split_error;
        std::vector<engine_ptr> stages;
        for (const layer_range & range : split) {
            engine_ptr stage = llama_engine_init(stage_params(opt, range, n_ctx), split_error);
            if (!stage) {
                break;
            }
            stages_json += (stages.empty() ? "" : ", ") + stage_json(stage->info());
            if (!stages.empty()) {
                seams_json += (seams_json.empty() ? "" : ", ") +
                              seam_json(stages.back()->info(), stage->info(), opt.boundary_dtype);
            }
            stages.push_back(std::move(stage));
        }
        run_record actual;
        if (split_error.empty()) {
            run_pipeline(stages, prompt, opt.n_decode, opt.perturb, opt.boundary_dtype, actual, split_error);
        }
        stages.clear();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

        double max_diff = 0.0;
        bool   finite   = true;
        for (size_t step = 0; step < std::min(actual.logits.size(), expected.logits.size()); ++step) {
            const std::vector<float> & a = actual.logits[step];
            const std::vector<float> & b = expected.logits[step];
            if (a.size() != b.size()) {
                split_error = "step " + std::to_string(step) + " returned " + std::to_string(a.size()) +
                              " logits, the unsplit model " + std::to_string(b.size());
                break;
            }
            for (size_t i = 0; i < a.size(); ++i) {
                const double diff = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
                if (!std::isfinite(diff)) {
                    finite = false;
                } else {
                    max_diff = std::max(max_diff, diff);
                }
            }
        }
        int32_t divergence = -1;
        for (size_t i = 0; i < expected.tokens.size(); ++i) {
            if (i >= actual.tokens.size() || actual.tokens[i] != expected.tokens[i]) {
                divergence = static_cast<int32_t>(i);
                break;
            }
        }
        const bool identical = split_error.empty() && divergence < 0;
        const bool ok = identical && finite && max_diff <= opt.tolerance;
        all_ok = all_ok && ok;

        splits_json += std::string(splits_json.empty() ? "" : ",\n") +
            "    {\"split\": " + json_str(layer_split_str(split)) +
            ", \"ok\": " + (ok ? "true" : "false") +
            ", \"greedy_identical\": " + (identical ? "true" : "false") +
            ", \"max_abs_logit_diff\": " + (finite ? json_num(max_diff) : "null") +
            ", \"first_divergence\": " + (divergence < 0 ? "null" : std::to_string(divergence)) +
            ", \"seconds\": " + json_num(std::round(seconds * 100.0) / 100.0) +
            (split_error.empty() ? "" : ", \"error\": " + json_str(split_error)) +
            ",\n     \"tokens\": " + json_ints(actual.tokens) +
            ",\n     \"stages\": [" + stages_json + "]" +
            ",\n     \"seams\": [" + seams_json + "]}";
    }

    std::printf("{\n"
                "  \"ok\": %s,\n"
                "  \"model\": %s,\n"
                "  \"arch\": %s, \"n_layer\": %d, \"n_embd\": %d, \"n_vocab\": %d,\n"
                "  \"n_prompt\": %d, \"n_decode\": %d, \"tolerance\": %s, \"perturb\": %s, \"boundary_row_bytes\": %zu,\n"
                "  \"boundary_dtype\": %s, \"boundary_schema\": %s,\n"
                "  \"reference\": {\"tokens\": %s, \"stages\": [%s]},\n"
                "  \"splits\": [\n%s\n  ]\n"
                "}\n",
                all_ok ? "true" : "false", json_str(opt.model).c_str(), json_str(reference_info.arch).c_str(),
                reference_info.n_layer, reference_info.n_embd, reference_info.n_vocab,
                opt.n_prompt, opt.n_decode, json_num(opt.tolerance).c_str(), json_num(opt.perturb).c_str(),
                static_cast<size_t>(reference_info.boundary_row) * sizeof(float),
                json_str(wire_dtype_name(opt.boundary_dtype)).c_str(), json_str(schema_name(reference_info.schema)).c_str(),
                json_ints(expected.tokens).c_str(), stage_json(reference_info).c_str(), splits_json.c_str());
    return all_ok ? 0 : 1;
}
