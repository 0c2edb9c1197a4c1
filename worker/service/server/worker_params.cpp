// worker_params.cpp - the flag table: `--name value` or `--name=value`, strict numbers; the
// usage text and the `--print-flags` listing are written from the same table.
#include "worker_params.h"

#include "layer_range.h"
#include "loop_drafts.h"
#include "loop_pipeline.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace meshnet {

static bool parse_int64(const std::string & text, int64_t & out) {
    if (text.empty()) return false;
    char * end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return false;
    out = value;
    return true;
}

template <std::string worker_params::*field>
static bool set_string(worker_params & params, const std::string & value) {
    params.*field = value;
    return true;
}

template <int32_t worker_params::*field, int64_t min, int64_t max>
static bool parse_int32(worker_params & params, const std::string & value) {
    int64_t n;
    if (!parse_int64(value, n) || n < min || n > max) return false;
    params.*field = static_cast<int32_t>(n);
    return true;
}

// The setters of numbers carry their bounds: the table's rows name them once.
template <int32_t worker_params::*field, int64_t min, int64_t max = INT32_MAX>
static constexpr flag_setter set_int32 = max == INT32_MAX ? flag_setter(parse_int32<field, min, max>, min)
                                                          : flag_setter(parse_int32<field, min, max>, min, max);

template <int64_t worker_params::*field, int64_t min>
static bool parse_int64_at_least(worker_params & params, const std::string & value) {
    int64_t n;
    if (!parse_int64(value, n) || n < min) return false;
    params.*field = n;
    return true;
}

template <int64_t worker_params::*field, int64_t min>
static constexpr flag_setter set_int64{parse_int64_at_least<field, min>, min};

// Any integer: out of range values are clamped here and refused with a message by validate.
static bool clamp_drafter_k(worker_params & params, const std::string & value) {
    int64_t n;
    if (!parse_int64(value, n)) return false;
    params.drafter_k = static_cast<int32_t>(std::max<int64_t>(INT32_MIN, std::min<int64_t>(n, INT32_MAX)));
    return true;
}

static constexpr flag_setter set_drafter_k{clamp_drafter_k, 1, 7};

static bool parse_epoch(worker_params & params, const std::string & value) {
    int64_t n;
    if (!parse_int64(value, n) || n < 0) return false;
    params.epoch = static_cast<uint64_t>(n);
    return true;
}

static constexpr flag_setter set_epoch{parse_epoch, 0};

static bool set_boundary_dtype(worker_params & params, const std::string & value) {
    return wire_dtype_parse(value, params.boundary_dtype);
}

static bool set_boundary_compression(worker_params & params, const std::string & value) {
    return boundary_encoding_parse(value, params.boundary_compression);
}

static bool set_drafter(worker_params & params, const std::string & value) {
    return drafter_kind_parse(value, params.drafter);
}

static bool set_local_relay(worker_params & params, const std::string & value) {
    if (value != "on" && value != "off") return false;
    params.local_relay = value == "on";
    return true;
}

static bool set_batching(worker_params & params, const std::string & value) {
    if (value != "exact" && value != "throughput") return false;
    params.throughput_batching = value == "throughput";
    return true;
}

static bool set_layers(worker_params & params, const std::string & value) {
    layer_range range;
    std::string why;
    if (!layer_range_parse(value, range, why, /*open_end=*/true)) return false;
    if (range.end != layer_range::to_n_layer && range.end <= range.begin) return false;
    params.layers = range;
    return true;
}

using P = worker_params;

const std::vector<worker_flag> & worker_flags() {
    static const std::vector<worker_flag> flags = {
        {"--model", "PATH", nullptr, "required",
         "GGUF model (the first split file for split models)",
         set_string<&P::model_path>},
        {"--layers", "BEGIN:END", "0:", nullptr,
         "owned layer range [BEGIN, END); END may be empty (to the model's n_layer)",
         set_layers},
        {"--route-id", "ID", "local", nullptr,
         "route identity every request must carry",
         set_string<&P::route_id>},
        {"--epoch", "N", "1", nullptr,
         "route epoch every request must carry (at least 0)",
         set_epoch},
        {"--manifest-digest", "HEX", nullptr, nullptr,
         "artifact identity reported by GetInfo",
         set_string<&P::manifest_digest>},
        {"--recipe-digest", "HEX", nullptr, nullptr,
         "recipe identity reported by GetInfo",
         set_string<&P::recipe_digest>},
        {"--route-digest", "HEX", nullptr, nullptr,
         "route identity reported by GetInfo",
         set_string<&P::route_digest>},
        {"--listen", "ADDR", "127.0.0.1:50051", nullptr,
         "gRPC address; port 0 picks one",
         set_string<&P::listen>},
        {"--metrics-listen", "ADDR", "127.0.0.1:9464", nullptr,
         "Prometheus /metrics address; '' disables it",
         set_string<&P::metrics_listen>},
        {"--slots", "N", "4", nullptr,
         "concurrent sessions (at least 1)",
         set_int32<&P::n_slots, 1>},
        {"--ctx", "N", "4096", nullptr,
         "context length per session (at least 1)",
         set_int32<&P::n_ctx, 1>},
        {"--batch", "N", "512", nullptr,
         "most tokens per engine step (at least 1)",
         set_int32<&P::n_batch, 1>},
        {"--threads", "N", nullptr, "all",
         "CPU threads; 0: all",
         set_int32<&P::n_threads, 0>},
        {"--gpu-layers", "N", "0", nullptr,
         "layers to offload",
         set_int32<&P::n_gpu_layers, 0>},
        {"--discard-depth", "N", "0", nullptr,
         "deepseek4: keep N snapshots of each session's compressed state (CSA, HCA and indexer "
         "compressors), so that one discard (ForwardRequest.discard_from, speculative decoding's "
         "rejected drafts) may drop up to the session's last N positions, once before the next step; "
         "GetInfo reports it as discard_depth, and a deeper discard, or a second one before a step, is "
         "refused with DISCARD_TOO_DEEP leaving the session as it was. A driver keeps windows x "
         "(drafts + 1) - 1 positions in flight within it. Costs memory per slot (the worker logs how "
         "much at start); below --batch. 0: deepseek4 cannot discard (can_discard false). Other "
         "architectures drop any suffix and ignore it",
         set_int32<&P::discard_depth, 0>},
        {"--max-loop-drafts", "N", "7", nullptr,
         "first stage: a speculative decode loop (ForwardRequest.loop_drafts) drafts at most N tokens "
         "per verify window, whatever a client asks (the recipe's maxDrafts); 0: loops decode plainly; "
         "at most 7",
         set_int32<&P::max_loop_drafts, 0, max_loop_drafts>},
        {"--max-loop-windows", "N", "8", nullptr,
         "first stage: a speculative decode loop keeps at most N verify windows in flight "
         "(loop_windows, the recipe's maxWindows); 1 to 8",
         set_int32<&P::max_loop_windows, 1, max_loop_windows>},
        {"--prefix-cache-entries", "N", "0", nullptr,
         "prefix cache: keep up to N released sessions' slots (their KV) so that a new session whose "
         "prompt starts with the same tokens copies those positions instead of computing them, bit for "
         "bit what a cold run computes (GetInfo prefix_block). An entry holds a slot no live session "
         "needs: it is given up, least recently used first, as soon as one does, so its memory is "
         "within --slots x --ctx. 0: off. deepseek4, whose memory copies whole sequences only: the "
         "entries are copies of a session's whole prompt up to its last block boundary, each reused "
         "only whole (a prompt that extends it, the next turn of a conversation)",
         set_int32<&P::prefix_cache_entries, 0>},
        {"--prefix-block", "N", "128", nullptr,
         "prefix cache: tokens per reusable block; a prefix is reusable in whole blocks, each "
         "prefilled as one step at a multiple of N from position 0 (the driver cuts prefills on this "
         "grid when every stage has the same)",
         set_int32<&P::prefix_block, 1>},
        {"--drafter", "mtp|dspark", nullptr, nullptr,
         "the last stage of a deepseek4 route hosts a drafter: mtp, the model's own MTP (nextn) block "
         "(patch 0016), or dspark, the DSpark GGUF of --drafter-model (patch 0017 loads the token "
         "embeddings it borrows). After each step that asks (ForwardRequest.want_drafts, set by a "
         "speculative decode loop) it drafts the next verify window's tokens "
         "(ForwardResponse.next_drafts, and the ring's token); GetInfo reports it as drafter. Refused "
         "at start on a stage without the last layer (or, for dspark, without a layer the drafter "
         "reads), a model without MTP layers (mtp), a drafter of another vocabulary (dspark) or "
         "another architecture",
         set_drafter},
        {"--drafter-k", "N", "3", nullptr,
         "tokens the drafter proposes per window, 1 to 7",
         set_drafter_k},
        {"--drafter-model", "F", nullptr, nullptr,
         "--drafter dspark: the DSpark drafter's GGUF (the artifact's Drafter-role file, what the "
         "operator passes for recipe.speculation.mode: DSpark)",
         set_string<&P::drafter_model>},
        {"--boundary-dtype", "T", "f32", nullptr,
         "f32, f16 or bf16 on the wire",
         set_boundary_dtype},
        {"--boundary-compression", "off|shuffle-lz4", "off", nullptr,
         "what this stage does to the boundaries it relays to --next-stage: shuffle-lz4 packs them "
         "losslessly (byte planes, then LZ4; the next stage checks size and CRC-32) when the next stage "
         "takes it (GetInfo boundary_encodings) and is not on this host (never on loopback). It pays "
         "only on links slower than the break-even, about 400 Mbit/s at DeepSeek V4's width "
         "(docs/protocol.md, \"Boundary compression\")",
         set_boundary_compression},
        {"--max-message-bytes", "N", "67108864", nullptr,
         "largest accepted request (at least 1024); answers are held to it too (RESPONSE_TOO_LARGE)",
         set_int64<&P::max_message_bytes, 1024>},
        {"--max-inflight-bytes", "N", nullptr,
         "twice the larger of the transport limit (2 x --max-message-bytes + 1 MiB) and a step of "
         "every slot (--batch tokens of boundary, at most --max-message-bytes, x --slots): 258 MiB by "
         "default",
         "bytes of requests received but not yet decoded, over every call and connection (gRPC's "
         "resource quota). Past them gRPC cancels calls with RESOURCE_EXHAUSTED (no ErrorInfo) and "
         "closes idle connections (UNAVAILABLE, the client reconnects), so that many large requests at "
         "once cannot take the worker's memory; 0: the default",
         set_int64<&P::max_inflight_bytes, 0>},
        {"--evict-idle-ms", "N", "1000", nullptr,
         "grace before an idle session may be evicted by a new session that needs its slot (sessions "
         "are never freed by time alone: an unreleased one counts as held until then)",
         set_int64<&P::evict_idle_ms, 0>},
        {"--batch-wait-us", "N", "0", nullptr,
         "let a step wait up to N us while other sessions' steps keep arriving, to share its decode; "
         "0: a stage never idles while steps are queued (those queued share a decode)",
         set_int64<&P::batch_wait_us, 0>},
        {"--exact-batch-rows", "N", "8", nullptr,
         "the widest step this stage may rely on computing exactly (0..8). At start the worker measures, "
         "on its own weights and device, the widest step of up to 8 rows whose rows are bit-identical to "
         "one-row steps, and whether sessions' rows sharing a step compute as alone (GetInfo "
         "exact_step_rows, exact_batching); N can only lower what it measured. Routes speculate only "
         "within every stage's exact step; sessions share steps (at most that many decode rows, a "
         "prefill alone) only where batching measured exact, else each steps alone. 0: claim nothing "
         "(no speculation through this stage, each session steps alone)",
         set_int32<&P::exact_batch_rows, 0, 8>},
        {"--batching", "exact|throughput", "exact", nullptr,
         "exact: sessions share engine steps only as exactness allows (--exact-batch-rows), so a "
         "session's tokens never depend on the load. throughput: steps of any size mix as upstream "
         "batches them, faster under load, and a session's tokens may then depend on what else runs "
         "(GetInfo throughput_batching); speculation still runs only within the exact step",
         set_batching},
        {"--pipeline-depth", "N", nullptr, "the model's layers / this stage's layers, rounded",
         "stages in the route: concurrent sessions are split into N groups so that every stage "
         "computes one at a time",
         set_int32<&P::pipeline_depth, 1>},
        {"--stream-flush-ms", "N", "100", nullptr,
         "decode loop: hold its answers for up to N ms and send them together, so that fewer sends "
         "interrupt the engine; the last one goes at once; 0: send each at once",
         set_int64<&P::stream_flush_ms, 0>},
        {"--tls-cert", "F", nullptr, nullptr,
         "serve TLS with this PEM certificate chain (with --tls-key)",
         set_string<&P::tls_cert>},
        {"--tls-key", "F", nullptr, nullptr,
         "the PEM private key of --tls-cert",
         set_string<&P::tls_key>},
        {"--tls-client-ca", "F", nullptr, nullptr,
         "require client certificates signed by this CA (mTLS)",
         set_string<&P::tls_client_ca>},
        {"--next-stage", "ADDR", nullptr, nullptr,
         "chain: relay steps to this worker (with TLS: presenting --tls-cert, trusting --next-stage-ca "
         "or --tls-client-ca)",
         set_string<&P::next_stage>},
        {"--next-stage-ca", "F", nullptr, "--tls-client-ca, where given",
         "the CA that signed the next stage's certificate: the link to it is TLS",
         set_string<&P::next_stage_ca>},
        {"--ring-last", "ADDR", nullptr, nullptr,
         "ring, on the first stage of a chain: subscribe to the sampled tokens of the route's last "
         "stage, so a decode loop goes on without waiting for the answer to come back along the chain "
         "(S network legs per token instead of 2(S-1)); same TLS as --next-stage",
         set_string<&P::ring_last>},
        {"--ring-ready-ms", "N", "60000", nullptr,
         "ring: the first stage reports SERVING on gRPC health (the pod's readiness probe; meshnet up "
         "reads the worker's serving line, logged at the same moment) only once it has subscribed at "
         "--ring-last, so a new route never starts as a chain; at most N ms after it starts listening "
         "it reports SERVING anyway, with one log line saying it could not subscribe and runs as a "
         "chain (it keeps subscribing, and the loop takes the ring once it has). Other workers are "
         "SERVING as soon as they listen",
         set_int64<&P::ring_ready_ms, 0>},
        {"--local-relay", "on|off", "on", nullptr,
         "without TLS: take relayed steps from a previous stage on this host over a plain socket on "
         "127.0.0.1 (GetInfo says its port), and send them so to a --next-stage on 127.0.0.1 that "
         "offers one; several times cheaper per token than gRPC",
         set_local_relay},
        {"--local-relay-idle-ms", "N", "60000", nullptr,
         "close a local relay connection that had no step in flight and sent nothing for N ms; its "
         "stage connects again when it next relays, so connections that only idle cannot hold the 16 "
         "a worker takes (at least 1)",
         set_int64<&P::local_relay_idle_ms, 1>},
        {"--route-key-file", "F", nullptr, nullptr,
         "the route's secret (64 hex digits; one per route, given to its stages, gateway and "
         "certification): Forward, ForwardStream, Relay, ReleaseSession and Ring are served only to "
         "callers proving it, this stage proves it to --next-stage and --ring-last, and its local relay "
         "opens with a token derived from it. Without it the worker serves anyone who reaches its port "
         "and offers no Ring and no local relay (--ring-last needs it); meshnet up and the operator "
         "always give one",
         set_string<&P::route_key_file>},
        {"--ring-subscribers", "N", "4", nullptr,
         "last stage: Ring streams open at once at most (the route's first stages; at least 1); one "
         "more is refused with RESOURCE_EXHAUSTED",
         set_int32<&P::ring_subscribers, 1>},
        {"--exit-with-parent", "PID", nullptr, nullptr,
         "stop as on SIGTERM once PID, this worker's parent, is gone (a supervisor that dies leaves no "
         "worker behind; Linux; above 1)",
         set_int64<&P::exit_with_parent, 2>},
        {"--check-args", "", nullptr, nullptr,
         "parse and check the other flags as a start would, print nothing and exit 0, or print why "
         "not and exit 2; loads no model, opens no port, does not look at --exit-with-parent's process",
         nullptr},
        {"--print-flags", "", nullptr, nullptr,
         "print this table of flags as JSON (name, metavar, takes_value, default, default_note, help, "
         "min, max) and exit",
         nullptr},
        {"--help", "", nullptr, nullptr,
         "print this usage and exit (also -h)",
         nullptr},
    };
    return flags;
}

static const worker_flag * flag_find(const std::string & name) {
    for (const worker_flag & flag : worker_flags()) {
        if (name == flag.name) return &flag;
    }
    return nullptr;
}

bool worker_params_parse(int argc, char ** argv, worker_params & params, std::string & error,
                         worker_action & action) {
    action = worker_action::run;
    // Known before any error, so that a caller checking argv gets the reason alone.
    for (int i = 1; i < argc; ++i) {
        if (std::string(argv[i]) == "--check-args") action = worker_action::check_args;
    }
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            action = worker_action::help;
            return true;
        }
        if (arg == "--print-flags") {
            action = worker_action::print_flags;
            return true;
        }
        if (arg == "--check-args") continue;
        std::string value;
        const size_t eq = arg.find('=');
        if (eq != std::string::npos) {
            value = arg.substr(eq + 1);
            arg   = arg.substr(0, eq);
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            error = "flag " + arg + " needs a value";
            return false;
        }
        const worker_flag * flag = flag_find(arg);
        if (flag == nullptr || flag->set == nullptr) {
            error = "unknown flag " + arg;
            return false;
        }
        if (!flag->set(params, value)) {
            error = "bad value for " + arg + ": '" + value + "'";
            return false;
        }
    }
    return worker_params_validate(params, error);
}

bool worker_params_validate(const worker_params & params, std::string & error) {
    if (params.model_path.empty()) {
        error = "--model is required";
        return false;
    }
    if ((params.drafter == drafter_kind::dspark) != !params.drafter_model.empty()) {
        error = "--drafter dspark and --drafter-model (the DSpark drafter's GGUF) go together";
        return false;
    }
    if (params.drafter_k < 1 || params.drafter_k > 7) {
        error = "--drafter-k takes 1 to 7 (tokens drafted per window), got " + std::to_string(params.drafter_k);
        return false;
    }
    if (params.tls_cert.empty() != params.tls_key.empty()) {
        error = "--tls-cert and --tls-key go together";
        return false;
    }
    if (!params.tls_client_ca.empty() && params.tls_cert.empty()) {
        error = "--tls-client-ca needs --tls-cert and --tls-key";
        return false;
    }
    // Without a CA the link could verify the next stage against no root and would only
    // time out; say what is missing instead.
    if (!params.next_stage.empty() && !params.tls_cert.empty() && params.next_stage_ca.empty() &&
        params.tls_client_ca.empty()) {
        error = "with TLS, --next-stage needs the CA that signed the next stage's certificate: "
                "--next-stage-ca F (or --tls-client-ca F for mTLS, one CA for the route)";
        return false;
    }
    if (!params.next_stage_ca.empty() && params.next_stage.empty()) {
        error = "--next-stage-ca needs --next-stage";
        return false;
    }
    if (!params.ring_last.empty() && params.next_stage.empty()) {
        error = "--ring-last closes a chain: it needs --next-stage (the first stage's successor)";
        return false;
    }
    if (!params.ring_last.empty() && params.route_key_file.empty()) {
        error = "--ring-last needs --route-key-file: the last stage serves its tokens only to holders "
                "of the route key";
        return false;
    }
    return true;
}

// `text` as lines of at most `width` characters, each after `indent` (the first after `first`).
static void wrap_into(std::ostringstream & out, const std::string & first, size_t indent,
                      const std::string & text, size_t width) {
    std::istringstream words(text);
    std::string line = first;
    std::string word;
    bool empty = true;
    while (words >> word) {
        if (!empty && line.size() + 1 + word.size() > width) {
            out << line << '\n';
            line = std::string(indent, ' ');
            empty = true;
        }
        line += empty ? word : " " + word;
        empty = false;
    }
    out << line << '\n';
}

std::string worker_params_usage() {
    constexpr size_t help_column = 28;
    std::ostringstream out;
    out << "usage: meshnet-shard-worker --model PATH --layers BEGIN:END [options]\n\n";
    for (const worker_flag & flag : worker_flags()) {
        std::string head = std::string("  ") + flag.name;
        if (flag.metavar[0] != '\0') head += std::string(" ") + flag.metavar;
        head += head.size() + 1 < help_column ? std::string(help_column - head.size(), ' ') : "\n" +
                std::string(help_column, ' ');
        std::string help = flag.help;
        if (flag.default_value != nullptr) {
            help += std::string(" (default: ") + (flag.default_value[0] ? flag.default_value : "''") + ")";
        } else if (flag.default_note != nullptr) {
            const std::string note = flag.default_note;
            help += note == "required" ? " (required)" : " (default: " + note + ")";
        }
        wrap_into(out, head, help_column, help, 100);
    }
    return out.str();
}

static std::string json_bound(bool has, int64_t bound) {
    return has ? std::to_string(bound) : "null";
}

static std::string json_string(const char * text) {
    if (text == nullptr) return "null";
    std::string out = "\"";
    for (const char * c = text; *c; ++c) {
        switch (*c) {
            case '"':  out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            default:
                if (static_cast<unsigned char>(*c) < 0x20) {
                    char escaped[8];
                    std::snprintf(escaped, sizeof(escaped), "\\u%04x", *c);
                    out += escaped;
                } else {
                    out += *c;
                }
        }
    }
    return out + "\"";
}

std::string worker_flags_json() {
    std::string out = "[\n";
    const std::vector<worker_flag> & flags = worker_flags();
    for (size_t i = 0; i < flags.size(); ++i) {
        const worker_flag & flag = flags[i];
        out += "  {\"name\": " + json_string(flag.name) + ", \"metavar\": " + json_string(flag.metavar) +
               ", \"takes_value\": " + (flag.set != nullptr ? "true" : "false") +
               ", \"default\": " + json_string(flag.default_value) +
               ", \"default_note\": " + json_string(flag.default_note) +
               ", \"help\": " + json_string(flag.help) +
               ", \"min\": " + json_bound(flag.set.bounded, flag.set.min) +
               ", \"max\": " + json_bound(flag.set.has_max, flag.set.max) + "}" +
               (i + 1 < flags.size() ? ",\n" : "\n");
    }
    return out + "]\n";
}

} // namespace meshnet
