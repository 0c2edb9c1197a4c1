// test-worker-params.cpp - the flag table: every listed flag parses its default, the
// parser keeps its bounds and refusals, and usage and listing name every flag.
#include "service_test.h"
#include "worker_params.h"

#include <string>
#include <tuple>
#include <vector>

using namespace meshnet;

namespace {

struct parsed {
    bool          ok;
    worker_params params;
    std::string   error;
    worker_action action;
};

parsed parse(std::vector<std::string> args) {
    args.insert(args.begin(), "meshnet-shard-worker");
    std::vector<char *> argv;
    for (std::string & arg : args) argv.push_back(arg.data());
    parsed out{};
    out.ok = worker_params_parse(static_cast<int>(argv.size()), argv.data(), out.params, out.error, out.action);
    return out;
}

bool refused(std::vector<std::string> args, const std::string & said) {
    args.insert(args.begin(), {"--model", "m.gguf"});
    const parsed result = parse(args);
    return !result.ok && result.error.find(said) != std::string::npos;
}

} // namespace

TEST("every flag with a default parses that default, both as --name value and --name=value") {
    int with_default = 0;
    for (const worker_flag & flag : worker_flags()) {
        if (flag.set == nullptr || flag.default_value == nullptr) continue;
        ++with_default;
        const parsed spaced = parse({"--model", "m.gguf", flag.name, flag.default_value});
        const parsed joined = parse({"--model", "m.gguf", std::string(flag.name) + "=" + flag.default_value});
        CHECK(spaced.ok);
        CHECK(joined.ok);
        if (!spaced.ok) std::printf("  %s %s: %s\n", flag.name, flag.default_value, spaced.error.c_str());
    }
    CHECK(with_default >= 20);
}

// Every field, so that a listed default that is not the struct's shows as a difference.
static auto fields(const worker_params & p) {
    return std::tie(p.model_path, p.layers.begin, p.layers.end, p.route_id, p.epoch, p.manifest_digest,
                    p.recipe_digest, p.route_digest, p.listen, p.metrics_listen, p.n_slots, p.n_ctx, p.n_batch,
                    p.n_threads, p.n_gpu_layers, p.discard_depth, p.drafter, p.drafter_k, p.drafter_model,
                    p.boundary_dtype, p.boundary_compression, p.max_message_bytes, p.max_inflight_bytes, p.evict_idle_ms,
                    p.batch_wait_us, p.pipeline_depth, p.exact_batch_rows, p.throughput_batching, p.stream_flush_ms,
                    p.max_loop_drafts, p.max_loop_windows, p.tls_cert, p.tls_key, p.tls_client_ca,
                    p.next_stage_ca, p.next_stage, p.ring_last, p.ring_ready_ms, p.local_relay,
                    p.local_relay_idle_ms, p.route_key_file, p.ring_subscribers, p.exit_with_parent);
}

TEST("a flag's listed default is the value the worker has without the flag") {
    const worker_params defaults;
    for (const worker_flag & flag : worker_flags()) {
        if (flag.set == nullptr || flag.default_value == nullptr) continue;
        worker_params given;
        CHECK(flag.set(given, flag.default_value));
        const bool same = fields(given) == fields(defaults);
        CHECK(same);
        if (!same) std::printf("  %s %s is not the default\n", flag.name, flag.default_value);
    }
}

TEST("every flag that takes a value refuses a missing one and an unknown flag is refused") {
    for (const worker_flag & flag : worker_flags()) {
        if (flag.set == nullptr) continue;
        const parsed result = parse({"--model", "m.gguf", flag.name});
        CHECK(!result.ok && result.error == std::string("flag ") + flag.name + " needs a value");
    }
    CHECK(refused({"--gpu-layer", "1"}, "unknown flag --gpu-layer"));
    CHECK(refused({"--check-args=1"}, "unknown flag --check-args"));
}

TEST("flags keep their values and bounds") {
    const parsed ok = parse({"--model=m.gguf", "--layers", "3:7", "--epoch", "9", "--slots=2", "--ctx", "64",
                             "--max-loop-drafts", "0", "--max-loop-windows", "8", "--exit-with-parent", "2",
                             "--local-relay", "off", "--boundary-dtype", "bf16", "--drafter", "mtp",
                             "--drafter-k", "7", "--max-message-bytes", "1024"});
    CHECK(ok.ok && ok.action == worker_action::run);
    CHECK(ok.params.model_path == "m.gguf" && ok.params.layers.begin == 3 && ok.params.layers.end == 7);
    CHECK(ok.params.epoch == 9 && ok.params.n_slots == 2 && ok.params.n_ctx == 64);
    CHECK(ok.params.max_loop_drafts == 0 && ok.params.max_loop_windows == 8 && ok.params.exit_with_parent == 2);
    CHECK(!ok.params.local_relay && ok.params.boundary_dtype == wire_dtype::bf16 && ok.params.drafter == drafter_kind::mtp);
    CHECK(ok.params.drafter_k == 7 && ok.params.max_message_bytes == 1024);
    for (const std::vector<std::string> & bad : std::vector<std::vector<std::string>>{
             {"--slots", "0"}, {"--ctx", "1x"}, {"--epoch", "-1"}, {"--threads", "-1"},
             {"--max-loop-drafts", "8"}, {"--max-loop-windows", "0"}, {"--max-loop-windows", "9"},
             {"--exit-with-parent", "1"}, {"--local-relay", "yes"}, {"--boundary-dtype", "f8"},
             {"--layers", "5:5"}, {"--max-message-bytes", "1023"}, {"--local-relay-idle-ms", "0"},
             {"--batch", "2147483648"}, {"--ring-subscribers", "0"}, {"--drafter", "eagle"}}) {
        CHECK(refused(bad, "bad value for " + bad[0]));
    }
}

TEST("--drafter names a kind: each kind's name (GetInfo's too) parses back to it, '' to none") {
    for (drafter_kind kind : {drafter_kind::none, drafter_kind::mtp, drafter_kind::dspark}) {
        drafter_kind back = kind == drafter_kind::mtp ? drafter_kind::dspark : drafter_kind::mtp;
        CHECK(drafter_kind_parse(drafter_kind_name(kind), back) && back == kind);
    }
    const parsed dspark = parse({"--model", "m.gguf", "--drafter", "dspark", "--drafter-model", "d.gguf"});
    CHECK(dspark.ok && dspark.params.drafter == drafter_kind::dspark && dspark.params.drafter_model == "d.gguf");
    const parsed none = parse({"--model", "m.gguf", "--drafter", "mtp", "--drafter="});
    CHECK(none.ok && none.params.drafter == drafter_kind::none);
    drafter_kind kept = drafter_kind::mtp;
    CHECK(!drafter_kind_parse("MTP", kept) && kept == drafter_kind::mtp); // the CRD's spelling is not the flag's
}

TEST("combinations are refused with a message that names the fix") {
    CHECK(!parse({"--layers", "0:4"}).ok && parse({"--layers", "0:4"}).error == "--model is required");
    CHECK(refused({"--drafter-k", "8"}, "--drafter-k takes 1 to 7"));
    CHECK(refused({"--drafter", "dspark"}, "--drafter dspark and --drafter-model"));
    CHECK(refused({"--drafter-model", "d.gguf"}, "--drafter dspark and --drafter-model"));
    CHECK(refused({"--tls-cert", "c"}, "--tls-cert and --tls-key go together"));
    CHECK(refused({"--tls-client-ca", "ca"}, "--tls-client-ca needs"));
    CHECK(refused({"--tls-cert", "c", "--tls-key", "k", "--next-stage", "h:1"}, "--next-stage-ca F"));
    CHECK(refused({"--next-stage-ca", "ca"}, "--next-stage-ca needs --next-stage"));
    CHECK(refused({"--ring-last", "h:1"}, "--ring-last closes a chain"));
    CHECK(refused({"--next-stage", "h:1", "--ring-last", "h:2"}, "--ring-last needs --route-key-file"));
    CHECK(parse({"--model", "m", "--next-stage", "h:1", "--ring-last", "h:2", "--route-key-file", "k"}).ok);
}

TEST("--check-args is known before an error and --help and --print-flags stop parsing") {
    const parsed late = parse({"--model", "m.gguf", "--bogus", "1", "--check-args"});
    CHECK(!late.ok && late.action == worker_action::check_args);
    const parsed good = parse({"--check-args", "--model", "m.gguf"});
    CHECK(good.ok && good.action == worker_action::check_args);
    CHECK(parse({"--print-flags", "--bogus"}).action == worker_action::print_flags);
    CHECK(parse({"-h"}).ok && parse({"-h"}).action == worker_action::help);
}

TEST("the usage and the listing name every flag") {
    const std::string usage = worker_params_usage();
    const std::string listing = worker_flags_json();
    for (const worker_flag & flag : worker_flags()) {
        CHECK(usage.find(std::string("  ") + flag.name) != std::string::npos);
        CHECK(listing.find(std::string("\"name\": \"") + flag.name + "\"") != std::string::npos);
    }
    CHECK(listing.find("\"default\": \"127.0.0.1:50051\"") != std::string::npos);
    CHECK(listing.find("'' disables it") != std::string::npos);
}

TEST_MAIN()
