// worker_params.cpp - flag parsing: `--name value` or `--name=value`, strict numbers.
#include "worker_params.h"

#include "layer_range.h"
#include "loop_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>

namespace meshnet {

const char * worker_params_usage() {
    return
        "usage: meshnet-shard-worker --model PATH --layers BEGIN:END [options]\n"
        "\n"
        "  --model PATH              GGUF model (first split file for split models)\n"
        "  --layers BEGIN:END        owned layer range [BEGIN, END); END may be empty (to n_layer)\n"
        "  --route-id ID             route identity every request must carry (default: local)\n"
        "  --epoch N                 route epoch every request must carry (default: 1)\n"
        "  --manifest-digest HEX     artifact identity reported by GetInfo\n"
        "  --recipe-digest HEX       recipe identity reported by GetInfo\n"
        "  --route-digest HEX        route identity reported by GetInfo\n"
        "  --listen ADDR             gRPC address (default: 127.0.0.1:50051; port 0 picks one)\n"
        "  --metrics-listen ADDR     Prometheus /metrics address (default: 127.0.0.1:9464; '' disables)\n"
        "  --slots N                 concurrent sessions (default: 4)\n"
        "  --ctx N                   context length per session (default: 4096)\n"
        "  --batch N                 most tokens per engine step (default: 512)\n"
        "  --threads N               CPU threads (default: all)\n"
        "  --gpu-layers N            layers to offload (default: 0)\n"
        "  --discard-depth N         deepseek4: keep N snapshots of each session's compressed state,\n"
        "                            so that one discard (speculative decoding's rejected drafts)\n"
        "                            may drop up to its last N positions, once before the next\n"
        "                            step; below --batch (default: 0: deepseek4 cannot discard;\n"
        "                            other architectures drop any suffix and ignore it)\n"
        "  --drafter mtp             last stage of a deepseek4 route: load the model's own MTP\n"
        "                            (nextn) layers and, after each sampled token, draft the next\n"
        "                            verify window's tokens (ForwardResponse.next_drafts, and the\n"
        "                            ring's token); refused on a stage without the last layer or\n"
        "                            a model without MTP layers (default: none)\n"
        "  --drafter-k N             tokens the drafter proposes per window, 1 to 7 (default: 3)\n"
        "  --drafter-model F         reserved for --drafter dspark (a DSpark GGUF), which this\n"
        "                            worker refuses for now\n"
        "  --boundary-dtype T        f32 | f16 | bf16 on the wire (default: f32)\n"
        "  --max-message-bytes N     largest accepted request (default: 67108864)\n"
        "  --max-inflight-bytes N    bytes of requests received but not yet decoded, all calls\n"
        "                            together; beyond them gRPC cancels calls (RESOURCE_EXHAUSTED)\n"
        "                            (default: 0: twice the larger of the transport limit, 2 x\n"
        "                            --max-message-bytes + 1 MiB, and a step of every slot)\n"
        "  --evict-idle-ms N         grace before an idle session may be evicted (default: 1000)\n"
        "  --batch-wait-us N         let a step wait up to N us while other sessions' steps keep\n"
        "                            arriving, to share its decode (default: 0: a stage never\n"
        "                            idles while steps are queued; those queued share a decode)\n"
        "  --exact-batch-rows N      batch invariance: a session's tokens do not depend on what\n"
        "                            else the stage batches. A prefill step runs alone and at most\n"
        "                            N decode steps share one engine step (the widths whose CPU\n"
        "                            kernels compute each row as alone). 0: any mix, faster under\n"
        "                            load, rows may differ in their last bits (default: 8 on the\n"
        "                            CPU, 0 with --gpu-layers: GPU kernels do not promise it)\n"
        "  --pipeline-depth N        stages in the route: concurrent sessions are split into N\n"
        "                            groups so that every stage computes one at a time (default:\n"
        "                            the model's layers / this stage's layers, rounded)\n"
        "  --max-loop-drafts N       first stage: a speculative decode loop drafts at most N tokens\n"
        "                            per verify window (the recipe's maxDrafts; 0: loops decode\n"
        "                            plainly; default: 7, the widest exact window)\n"
        "  --max-loop-windows N      first stage: a speculative decode loop keeps at most N verify\n"
        "                            windows in flight (the recipe's maxWindows; default: 8)\n"
        "  --stream-flush-ms N       decode loop: hold its answers for up to N ms and send them\n"
        "                            together, so that fewer sends interrupt the engine; the last\n"
        "                            one goes at once (default: 100; 0: send each at once)\n"
        "  --tls-cert F --tls-key F  serve TLS with this PEM certificate chain and key\n"
        "  --tls-client-ca F         require client certificates signed by this CA (mTLS)\n"
        "  --next-stage ADDR         chain: relay steps to this worker (with TLS: presenting\n"
        "                            --tls-cert, trusting --next-stage-ca or --tls-client-ca)\n"
        "  --next-stage-ca F         the CA that signed the next stage's certificate: the link\n"
        "                            to it is TLS (default: --tls-client-ca, where given)\n"
        "  --ring-last ADDR          ring, on the first stage of a chain: subscribe to the sampled\n"
        "                            tokens of the route's last stage, so a decode loop goes on\n"
        "                            without waiting for the answer to come back along the chain\n"
        "                            (S network legs per token instead of 2(S-1)); same TLS as\n"
        "                            --next-stage\n"
        "  --ring-ready-ms N         ring: the first stage reports SERVING (gRPC health) only once\n"
        "                            subscribed at --ring-last, or after N ms at most, then logs\n"
        "                            that it runs as a chain until it subscribes (default: 60000)\n"
        "  --local-relay on|off      without TLS: take relayed steps from a previous stage on this\n"
        "                            host over a plain socket on 127.0.0.1 (GetInfo says its port),\n"
        "                            and send them so to a --next-stage on 127.0.0.1 that offers\n"
        "                            one; several times cheaper per token than gRPC (default: on)\n"
        "  --local-relay-idle-ms N   close a local relay connection that carried nothing for N ms\n"
        "                            (its stage connects again when it next relays), so idle ones\n"
        "                            cannot hold the 16 connections there are (default: 60000)\n"
        "  --exit-with-parent PID    stop as on SIGTERM once PID, this worker's parent, is gone\n"
        "                            (a supervisor that dies leaves no worker behind; Linux)\n";
}

static bool parse_int64(const std::string & text, int64_t & out) {
    if (text.empty()) return false;
    char * end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return false;
    out = value;
    return true;
}

bool worker_params_parse(int argc, char ** argv, worker_params & params, std::string & error, bool & help) {
    help = false;
    auto int32_into = [](int32_t & field, int64_t min) {
        return [&field, min](const std::string & v) {
            int64_t n;
            if (!parse_int64(v, n) || n < min || n > INT32_MAX) return false;
            field = static_cast<int32_t>(n);
            return true;
        };
    };
    auto string_into = [](std::string & field) {
        return [&field](const std::string & v) { field = v; return true; };
    };
    std::map<std::string, std::function<bool(const std::string &)>> flags = {
        {"--model",           string_into(params.model_path)},
        {"--route-id",        string_into(params.route_id)},
        {"--manifest-digest", string_into(params.manifest_digest)},
        {"--recipe-digest",   string_into(params.recipe_digest)},
        {"--route-digest",    string_into(params.route_digest)},
        {"--listen",          string_into(params.listen)},
        {"--metrics-listen",  string_into(params.metrics_listen)},
        {"--tls-cert",        string_into(params.tls_cert)},
        {"--tls-key",         string_into(params.tls_key)},
        {"--tls-client-ca",   string_into(params.tls_client_ca)},
        {"--next-stage-ca",   string_into(params.next_stage_ca)},
        {"--next-stage",      string_into(params.next_stage)},
        {"--ring-last",       string_into(params.ring_last)},
        {"--drafter",         string_into(params.drafter)},
        {"--drafter-model",   string_into(params.drafter_model)},
        {"--drafter-k", [&](const std::string & v) {
            int64_t n;
            if (!parse_int64(v, n)) return false;
            params.drafter_k = static_cast<int32_t>(std::max<int64_t>(INT32_MIN, std::min<int64_t>(n, INT32_MAX)));
            return true;
        }},
        {"--slots",           int32_into(params.n_slots, 1)},
        {"--ctx",             int32_into(params.n_ctx, 1)},
        {"--batch",           int32_into(params.n_batch, 1)},
        {"--threads",         int32_into(params.n_threads, 0)},
        {"--gpu-layers",      int32_into(params.n_gpu_layers, 0)},
        {"--discard-depth",   int32_into(params.discard_depth, 0)},
        {"--pipeline-depth",  int32_into(params.pipeline_depth, 1)},
        {"--exact-batch-rows", int32_into(params.exact_batch_rows, 0)},
        {"--max-loop-drafts", [&](const std::string & v) {
            return int32_into(params.max_loop_drafts, 0)(v) && params.max_loop_drafts <= static_cast<int32_t>(max_loop_drafts);
        }},
        {"--max-loop-windows", [&](const std::string & v) {
            return int32_into(params.max_loop_windows, 1)(v) && params.max_loop_windows <= static_cast<int32_t>(max_loop_windows);
        }},
        {"--epoch", [&](const std::string & v) {
            int64_t n;
            if (!parse_int64(v, n) || n < 0) return false;
            params.epoch = static_cast<uint64_t>(n);
            return true;
        }},
        {"--max-message-bytes", [&](const std::string & v) {
            return parse_int64(v, params.max_message_bytes) && params.max_message_bytes >= 1024;
        }},
        {"--max-inflight-bytes", [&](const std::string & v) {
            return parse_int64(v, params.max_inflight_bytes) && params.max_inflight_bytes >= 0;
        }},
        {"--batch-wait-us", [&](const std::string & v) {
            return parse_int64(v, params.batch_wait_us) && params.batch_wait_us >= 0;
        }},
        {"--stream-flush-ms", [&](const std::string & v) {
            return parse_int64(v, params.stream_flush_ms) && params.stream_flush_ms >= 0;
        }},
        {"--exit-with-parent", [&](const std::string & v) {
            return parse_int64(v, params.exit_with_parent) && params.exit_with_parent > 1;
        }},
        {"--ring-ready-ms", [&](const std::string & v) {
            return parse_int64(v, params.ring_ready_ms) && params.ring_ready_ms >= 0;
        }},
        {"--local-relay-idle-ms", [&](const std::string & v) {
            return parse_int64(v, params.local_relay_idle_ms) && params.local_relay_idle_ms >= 1;
        }},
        {"--evict-idle-ms", [&](const std::string & v) {
            return parse_int64(v, params.evict_idle_ms) && params.evict_idle_ms >= 0;
        }},
        {"--boundary-dtype", [&](const std::string & v) { return wire_dtype_parse(v, params.boundary_dtype); }},
        {"--local-relay", [&](const std::string & v) {
            if (v != "on" && v != "off") return false;
            params.local_relay = v == "on";
            return true;
        }},
        {"--layers", [&](const std::string & v) {
            layer_range range;
            std::string why;
            if (!layer_range_parse(v, range, why, /*open_end=*/true)) return false;
            if (range.end != layer_range::to_n_layer && range.end <= range.begin) return false;
            params.layer_begin = range.begin;
            params.layer_end   = range.end;
            return true;
        }},
    };
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            help = true;
            return false;
        }
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
        const auto flag = flags.find(arg);
        if (flag == flags.end()) {
            error = "unknown flag " + arg;
            return false;
        }
        if (!flag->second(value)) {
            error = "bad value for " + arg + ": '" + value + "'";
            return false;
        }
    }
    if (params.model_path.empty()) {
        error = "--model is required";
        return false;
    }
    if (params.drafter == "dspark") {
        error = "--drafter dspark (a DSpark GGUF, --drafter-model) is not implemented by this worker yet; "
                "--drafter mtp is";
        return false;
    }
    if (!params.drafter.empty() && params.drafter != "mtp") {
        error = "--drafter takes mtp (the model's own MTP layers), got '" + params.drafter + "'";
        return false;
    }
    if (!params.drafter_model.empty()) {
        error = "--drafter-model names a DSpark drafter's GGUF (--drafter dspark), which this worker "
                "does not run yet";
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
    return true;
}

} // namespace meshnet
