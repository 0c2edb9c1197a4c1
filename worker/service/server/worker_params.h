// worker_params.h - command-line flags of meshnet-shard-worker (defaults bind to
// loopback; the operator passes every identity explicitly). One table of flags
// (worker_flags) is the parser, the usage text and the `--print-flags` listing.
#pragma once

#include "boundary_codec.h"
#include "boundary_compression.h"
#include "drafter_kind.h"
#include "layer_range.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

struct worker_params {
    std::string model_path;
    layer_range layers{0, layer_range::to_n_layer}; // --layers (open end: to n_layer)
    std::string route_id        = "local";
    uint64_t    epoch           = 1;
    std::string manifest_digest;
    std::string recipe_digest;
    std::string route_digest;
    std::string listen          = "127.0.0.1:50051";
    std::string metrics_listen  = "127.0.0.1:9464"; // "" disables /metrics
    int32_t     n_slots         = 4;
    int32_t     n_ctx           = 4096;
    int32_t     n_batch         = 512;          // max tokens per step (and per Forward)
    int32_t     n_threads       = 0;
    int32_t     n_gpu_layers    = 0;
    int32_t     discard_depth   = 0;            // deepseek4: snapshots per slot (positions a discard may drop)
    drafter_kind drafter        = drafter_kind::none; // the last stage's drafter (--drafter)
    int32_t     drafter_k       = 3;            // tokens the drafter proposes per window (1..7)
    std::string drafter_model;                  // --drafter dspark's GGUF
    wire_dtype  boundary_dtype  = wire_dtype::f32;
    boundary_encoding boundary_compression = boundary_encoding::raw; // what relayed boundaries are packed as
    int64_t     max_message_bytes = 64ll << 20;
    int64_t     max_inflight_bytes = 0;         // requests gRPC holds undecoded, all calls (0: derived)
    int64_t     evict_idle_ms   = 1000;
    int64_t     batch_wait_us   = 0;
    int32_t     pipeline_depth  = 0;            // stages in the route; 0: n_layer / owned layers
    int32_t     exact_batch_rows = 8;           // the widest exact step claimed at most (measured at start)
    bool        throughput_batching = false;    // --batching throughput: steps mix as upstream batches
    int64_t     stream_flush_ms = 100;          // decode loop: send its answers at least this often
    int32_t     max_loop_drafts  = 7;           // a speculative loop's drafts per window at most
    int32_t     max_loop_windows = 8;           // its verify windows in flight at most
    int32_t     prefix_cache_entries = 0;       // released slots kept for their prefix (0: off)
    int32_t     prefix_block    = 128;          // tokens per reusable prefix block
    std::string tls_cert;
    std::string tls_key;
    std::string tls_client_ca;                  // set: clients must present a cert (mTLS)
    std::string next_stage_ca;                  // verifies --next-stage (default: tls_client_ca)
    std::string next_stage;                     // chain: relay steps here (HOST:PORT)
    std::string ring_last;                      // ring: the route's last stage (HOST:PORT)
    int64_t     ring_ready_ms   = 60000;        // ring: health waits this long for the subscription
    bool        local_relay     = true;         // offer / use the local relay (no TLS only)
    int64_t     local_relay_idle_ms = 60000;    // close a local relay connection silent this long
    std::string route_key_file;                 // the route's secret: callers must prove it
    int32_t     ring_subscribers = 4;           // last stage: Ring streams open at once at most
    int64_t     exit_with_parent = 0;           // stop when this process (our parent) exits
};

// How a flag takes its value, and for a number the bounds it accepts (listed by
// --print-flags, so that the docs are written from them).
struct flag_setter {
    using parse_fn = bool (*)(worker_params & params, const std::string & value); // false: bad value

    constexpr flag_setter(std::nullptr_t = nullptr) {}
    constexpr flag_setter(parse_fn parse) : parse(parse) {}
    constexpr flag_setter(parse_fn parse, int64_t min) : parse(parse), bounded(true), min(min) {}
    constexpr flag_setter(parse_fn parse, int64_t min, int64_t max)
        : parse(parse), bounded(true), min(min), has_max(true), max(max) {}

    bool operator()(worker_params & params, const std::string & value) const { return parse(params, value); }
    bool operator==(std::nullptr_t) const { return parse == nullptr; }
    bool operator!=(std::nullptr_t) const { return parse != nullptr; }

    parse_fn parse   = nullptr;
    bool     bounded = false; // a number: at least min (and at most max, with has_max)
    int64_t  min     = 0;
    bool     has_max = false;
    int64_t  max     = 0;
};

// One flag. A flag without a setter takes no value and selects what the process does
// (worker_action); every other one takes `--name value` or `--name=value`.
struct worker_flag {
    const char * name;          // "--model"
    const char * metavar;       // "PATH"; "" for a flag without a value
    const char * default_value; // the value that gives the default, or nullptr (none, or derived)
    const char * default_note;  // the default in words where there is no such value, or nullptr
    const char * help;          // plain text, one paragraph
    flag_setter  set;
};

// Every flag, in the order the usage lists them.
const std::vector<worker_flag> & worker_flags();

// What the command line asks for besides the flags' values.
enum class worker_action {
    run,         // load the model and serve
    help,        // -h, --help: print the usage
    print_flags, // --print-flags: print worker_flags_json()
    check_args,  // --check-args: parse and validate the flags, then exit
};

// Parses argv and checks the flags' values together; false with `error` set. `action`
// says what else was asked (help and print_flags stop parsing: `params` is then partial).
bool worker_params_parse(int argc, char ** argv, worker_params & params, std::string & error,
                         worker_action & action);

// The checks of values that only make sense together (run by worker_params_parse).
bool worker_params_validate(const worker_params & params, std::string & error);

std::string worker_params_usage();

// The flag table as JSON: [{"name", "metavar", "takes_value", "default", "default_note", "help",
// "min", "max"}]; min and max are null where a flag has no such bound.
std::string worker_flags_json();

} // namespace meshnet
