// metrics.h - the worker's Prometheus metrics and the small HTTP server that exposes
// them as text on their own port (GET /metrics).
#pragma once

#include "boundary_compression.h"

#include <grpcpp/support/status.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace meshnet {

// A cumulative histogram of seconds (the caller holds the registry's lock).
struct seconds_histogram {
    explicit seconds_histogram(std::vector<double> bounds);

    void observe(double seconds);
    void render(std::ostringstream & out, const char * name, const char * help) const;

    std::vector<double>  bounds;
    std::vector<int64_t> counts;
    double               sum   = 0.0;
    int64_t              count = 0;
};

class metrics_registry {
public:
    metrics_registry();

    void count_request(const std::string & rpc, const std::string & code);
    // An RPC's answer: counted by code and, when it failed with an ErrorInfo, by reason
    // (a fixed set), so a dashboard sees CACHE_MISS and EPOCH_MISMATCH apart.
    void count_answer(const std::string & rpc, const grpc::Status & status);
    void observe_forward_seconds(double seconds);
    // What the seam to the next stage added to one relayed step: the round trip less the
    // next stage's own time from arrival to answer (transport and codecs, both ways).
    void observe_next_hop_seconds(double seconds);
    // The drafter's pass after one sampled step (last stage with a drafter).
    void observe_draft_seconds(double seconds);
    // A boundary that arrived (in) or left (out): its raw payload bytes and the bytes its
    // encoding made of them on the link (the same for raw).
    void add_boundary(bool out, boundary_encoding encoding, int64_t raw_bytes, int64_t wire_bytes);
    // A boundary refused because it did not unpack (INVALID_BOUNDARY_ENCODING).
    void count_boundary_decode_failure() { boundary_decode_failures_++; }
    // A batch of relayed steps came from the previous stage (over the local relay, or gRPC).
    void count_relay_batch(bool local) { (local ? relay_batches_local_ : relay_batches_grpc_)++; }
    // A speculative step verified at this (last) stage: its drafts, and how many held.
    void count_drafts(int64_t verified, int64_t accepted) { drafts_verified_ += verified; drafts_accepted_ += accepted; }
    // Since start: the draft tokens verified here and those accepted (GetCapacity reports
    // them, so the operator shows the route's acceptance without scraping /metrics).
    int64_t drafts_verified() const { return drafts_verified_.load(); }
    int64_t drafts_accepted() const { return drafts_accepted_.load(); }

    // Gauges and counters owned elsewhere, read at scrape time.
    struct gauges {
        int64_t tokens_processed = 0;
        int64_t engine_steps     = 0;
        int64_t engine_micros    = 0; // time the engine spent in steps
        int64_t superseded_steps = 0; // answered STEP_SUPERSEDED (scheduler::superseded_steps)
        int64_t active_sessions  = 0;
        int64_t slots_total      = 0;
        int64_t kv_tokens_used   = 0;
        int64_t kv_tokens_total  = 0;
        int64_t queue_depth      = 0;
        int64_t epoch            = 0;
        // prefix cache (scheduler::prefix_counts)
        int64_t prefix_lookups       = 0;
        int64_t prefix_hits          = 0;
        int64_t prefix_reused_tokens = 0;
        int64_t prefix_entries       = 0;
        int64_t prefix_entry_bytes   = 0; // KV bytes of the positions the entries hold
        int64_t prefix_snapshots_skipped = 0; // whole-only cache: snapshots with no slot to spare
    };

    std::string render(const gauges & now) const;

private:
    mutable std::mutex                                  mutex_;
    std::map<std::pair<std::string, std::string>, int64_t> requests_;
    std::map<std::pair<std::string, std::string>, int64_t> errors_; // (rpc, reason)
    seconds_histogram                                   forward_;
    seconds_histogram                                   next_hop_;
    seconds_histogram                                   draft_;
    const double                                        start_time_; // Unix seconds
    // [out][encoding]: raw payload bytes, and the bytes on the link
    std::atomic<int64_t>                                boundary_raw_[2][2]{};
    std::atomic<int64_t>                                boundary_wire_[2][2]{};
    std::atomic<int64_t>                                boundary_decode_failures_{0};
    std::atomic<int64_t>                                relay_batches_grpc_{0};
    std::atomic<int64_t>                                relay_batches_local_{0};
    std::atomic<int64_t>                                drafts_verified_{0};
    std::atomic<int64_t>                                drafts_accepted_{0};
};

// Serves `render()` on GET /metrics, and the worker's health on GET /health (200 while
// it serves, 503 before and after: what the gRPC health service says, for kubelet
// probes, which cannot speak TLS to the gRPC port); 404 elsewhere.
class metrics_server {
public:
    ~metrics_server();

    void set_serving(bool serving) { serving_.store(serving); }

    // Binds host:port (port 0 picks one); false with `error` set on failure.
    bool start(const std::string & address, std::function<std::string()> render, std::string & error);
    void stop();
    int  port() const { return port_; }

private:
    void serve();
    void answer(int fd, const std::string & request);

    int                          listen_fd_ = -1;
    int                          port_      = 0;
    std::atomic<bool>            stopping_{false};
    std::atomic<bool>            serving_{false};
    std::function<std::string()> render_;
    std::thread                  thread_;
};

// Splits "host:port" / "[v6]:port"; false when malformed.
bool split_host_port(const std::string & address, std::string & host, int & port);

} // namespace meshnet
