// stage_core.h - one stage's step core, whatever transport a step came by (Forward,
// ForwardStream, Relay over gRPC or the local relay): a step is checked, decoded and
// planned before it reaches the engine, so a bad request never touches a session; once
// run, it is answered here or relayed down the chain. It holds no gRPC service: the RPCs
// (shard_service) and the transports call into it.
#pragma once

#include "boundary_codec.h"
#include "engine.h"
#include "error_info.h"
#include "exactness_probe.h"
#include "host_facts.h"
#include "metrics.h"
#include "relay_link.h"
#include "ring.h"
#include "route_key.h"
#include "sampling.h"
#include "scheduler.h"
#include "session_store.h"
#include "step_checks.h"
#include "tokenize_bound.h"

#include "meshnet/shard/v1/shard_service.pb.h"

#include <grpcpp/channel.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace meshnet {

namespace pb = ::meshnet::shard::v1;

// What the worker says about itself (GetInfo) besides the engine's facts.
struct service_identity {
    std::string route_id;
    uint64_t    epoch = 0;
    std::string manifest_digest;
    std::string recipe_digest;
    std::string route_digest;
    std::string incarnation;
    std::string worker_version;
    wire_dtype  boundary_dtype    = wire_dtype::f32;
    int64_t     max_message_bytes = 64ll << 20;
    int32_t     max_step_tokens   = 512;
    std::vector<int32_t> eos_token_ids; // from the GGUF vocabulary (engine_info has none)
    std::string chat_template;          // the GGUF's tokenizer.chat_template ("" when none)
    tokenize_bound tokenize;            // how text bytes bound its tokens (Tokenize)
    std::string next_stage;             // chain successor ("" when none)
    std::string ring_last;              // the ring's last stage, as given ("" when none)
    std::chrono::milliseconds stream_flush{100}; // decode loop answers are sent at least this often
    int32_t                   max_loop_drafts  = 7; // a speculative loop's drafts per window at most
    int32_t                   max_loop_windows = 8; // its verify windows in flight at most
    compute_placement         placement;         // where the engine computes
    int32_t                   local_relay_port = 0; // GetInfo: the local relay (0: none)
    exactness                 exact;                // GetInfo: what the engine measured to compute exactly
    bool                      throughput_batching = false; // --batching throughput
    route_key                 key;                  // --route-key-file (absent: none)
    int32_t                   ring_subscribers = 4; // last stage: Ring streams at most
    // What relayed boundaries are packed as where the next stage takes it: --boundary-compression,
    // already off for a next stage on loopback (worker_server's rule).
    boundary_encoding         next_stage_encoding = boundary_encoding::raw;
};

// How the answer to one accepted step is built once the engine ran it.
struct output_plan {
    bool                 last = false;
    pb::OutputKind       kind = pb::OUTPUT_KIND_UNSPECIFIED;
    std::vector<int32_t> rows;          // last stage: rows of the step
    std::vector<int32_t> row_positions; // their positions (sampling seed)
    int32_t              top_k = 0;
    sampling_params      sampling;
    int64_t              n_tokens = 0;
    int64_t              n_past = 0;
    bool                 relay = false;  // pass the output on to the next stage
    pb::ForwardRequest   relay_request;  // its request, less the boundary
    uint32_t             continue_tokens = 0; // stream decode loop: tokens still to go
    bool                 ring = false;   // last stage: also send the sampled token over Ring
    uint64_t             window = 0;     // ForwardRequest.window, carried back on the ring
    int32_t              want_drafts = 0; // last stage with a drafter: drafts after the step
    pb::RouteKey         key;            // the step's session
    std::vector<int32_t> step_tokens;   // VERIFIED: the step's tokens (the drafts after the first)
    boundary_encoding    answer_encoding = boundary_encoding::raw; // a non-last stage's answered boundary
};

// One step a transport hands to the core, and how it hears back.
struct step_call {
    bool                                      streaming = false; // it came on a ForwardStream
    std::function<bool()>                     cancelled;         // polled before and after it runs
    pb::ForwardResponse *                     response = nullptr; // filled before `then` gets OK;
                                                                  // it must outlive `then`
    std::function<void(const grpc::Status &)> then;              // once, on any thread
};

class stage_core {
public:
    stage_core(service_identity identity, engine_i & engine, session_store & sessions, scheduler & steps,
               metrics_registry & metrics, std::shared_ptr<grpc::Channel> next_stage = nullptr,
               bool next_stage_local = false, std::shared_ptr<grpc::Channel> ring_last = nullptr);
    ~stage_core();
    stage_core(const stage_core &) = delete;
    stage_core & operator=(const stage_core &) = delete;

    // The one way a step reaches the engine, whatever carried it: checked, then queued;
    // once run it is answered (relayed down the chain first when it asks), its latency
    // recorded, and `call.then` gets the status. A refused step returns its error and
    // nothing is queued (`then` is not called). `before_queue`, when given, runs once the
    // checks passed and before the step is queued, told whether its tokens will also
    // come back over the ring (a decode loop's step while the ring is up).
    std::optional<shard_error> submit(const pb::ForwardRequest & request, step_call call,
                                      const std::function<void(bool rides_ring)> & before_queue = nullptr);
    // The steps of one relayed batch, one call each: none starts before all are queued, so
    // they share an engine step; a session's second step in the batch is refused (run, it
    // would fail and clear the session). Each step's error, or nullopt where it was queued.
    std::vector<std::optional<shard_error>> submit_batch(
        const google::protobuf::RepeatedPtrField<pb::ForwardRequest> & requests, std::vector<step_call> calls);
    std::optional<shard_error> check_key(const pb::RouteKey & key) const;
    // The checks of prepare that need neither session nor engine (step_checks).
    std::optional<shard_error> check(const pb::ForwardRequest & request, bool streaming) const {
        return check_step(request, stage_, streaming);
    }
    // Frees the session here (`done` gets whether it held it) and down the chain.
    void release(const session_key & key, std::function<void(bool)> done = nullptr);

    // The Ring RPC's stream for a first stage whose key was checked (last stage).
    grpc::ServerWriteReactor<pb::RingResponse> * subscribe_ring(const pb::RouteKey & key);
    // Ends the Ring subscribers' streams and this stage's subscription (the worker
    // stops: they would hold it up).
    void stop_ring();
    // First stage: the incarnation of the ring's last stage it is subscribed at ("" when none).
    std::string ring_last_incarnation() const;
    bool has_ring_link() const { return ring_link_ != nullptr; }
    // First stage of a ring: until it subscribed at the last stage (ring_link::wait_subscribed);
    // at once `subscribed` without a ring.
    ring_link::wait_result wait_ring(std::chrono::milliseconds bound, std::string & why);
    ring_waiters & ring() { return ring_waiters_; }

    const service_identity &  identity() const { return identity_; }
    const engine_info &       info() const { return stage_.info; }
    int64_t                   n_ctx() const { return stage_.info.n_ctx; }
    std::chrono::milliseconds stream_flush() const { return identity_.stream_flush; }
    engine_i &                engine() { return engine_; }
    session_store &           sessions() { return sessions_; }
    double                    recent_tokens_per_second() const { return steps_.recent_tokens_per_second(); }
    int32_t                   prefix_block() const { return steps_.prefix_block(); } // 0: no prefix cache
    metrics_registry &        metrics() { return metrics_; }
    metrics_registry::gauges  gauges() const;

private:
    // Checks a step and turns it into a job answering `call` (submit); `rides_ring` says
    // whether its tokens also come over the ring.
    std::optional<shard_error> accept(const pb::ForwardRequest & request, step_call call, step_job & job,
                                      bool & rides_ring);
    // Checks a step and turns it into a job; the error answers the request otherwise.
    std::optional<shard_error> prepare(const pb::ForwardRequest & request, step_job & job, output_plan & plan,
                                       bool streaming);
    // Fills the response of a step the engine ran.
    void answer(const output_plan & plan, step_outcome & outcome, pb::ForwardResponse & response);
    // Answers a step the engine ran: fills `response` (relaying it down the chain first
    // when the plan says so), then calls `then` with the status, on any thread. Called
    // from `done` on the engine thread: a relayed step waits in the outbox until the
    // engine step's last `done`, and goes with the others as one batch.
    void complete(output_plan & plan, step_outcome & outcome, pb::ForwardResponse & response,
                  std::function<void(const grpc::Status &)> then);
    // This stage's output boundary (n_tokens rows), encoded in its wire dtype.
    void write_boundary(int64_t n_tokens, const std::vector<float> & rows, pb::Boundary & out);
    // Packs a written boundary for its link in `encoding` (after its digest was taken), counted
    // as bytes out.
    void pack_boundary(pb::Boundary & boundary, boundary_encoding encoding);
    // The boundary `sent` of a step that ran: a grid block's digest extends the output chain
    // of its slot's cached prefix; a hit names the copied prefix's chain to the next stage.
    void chain_sent(const output_plan & plan, const step_outcome & outcome, const pb::Boundary & sent,
                    google::protobuf::RepeatedPtrField<std::string> & prefix_chain);
    // This stage's entry in a step's chain trace.
    void write_trace(int64_t engine_micros, pb::StageTrace & out) const;
    // A step answered: its time from `arrived` goes in `response` and the latency histogram.
    void record_served(pb::ForwardResponse & response, std::chrono::steady_clock::time_point arrived);

    // A step waiting to be relayed with the others of its engine step.
    struct relay_entry {
        pb::ForwardRequest                        request;
        pb::RouteKey                              key;      // kept: `request` goes to the link
        pb::StageTrace                            own;      // this stage's hop
        pb::ForwardResponse *                     response = nullptr;
        std::function<void(const grpc::Status &)> then;
    };

    // Last stage with a drafter, a step that wants drafts: those to follow `token`, sampled
    // for position `pos`, go in the answer (ForwardResponse.next_drafts).
    void draft_next(const output_plan & plan, int32_t pos, int32_t token, const step_outcome & outcome,
                    pb::ForwardResponse & response);
    // A non-first stage's boundary rows, as f32 (unpacked and checked when encoded; NaN/Inf
    // refused), counted as bytes in; `digest`: the SHA-256 of its raw bytes, when asked.
    std::optional<shard_error> decode_boundary(const pb::ForwardRequest & request, std::vector<float> & rows,
                                               std::string * digest);
    // Sends the outbox as one batch (after every engine step, on the engine thread).
    void flush_relays();

    service_identity   identity_;
    engine_i &         engine_;
    const stage_facts  stage_;
    session_store &    sessions_;
    scheduler &        steps_;
    metrics_registry & metrics_;
    std::mutex               outbox_mutex_;
    std::vector<relay_entry> outbox_;
    ring_waiters             ring_waiters_;
    ring_hub                 ring_hub_;   // last stage: the first stages subscribed to its tokens
    std::unique_ptr<ring_link>  ring_link_; // first stage: its subscription at the last stage
    std::unique_ptr<relay_link> next_; // declared last: it goes first, while the rest still stands
};

} // namespace meshnet
