// relay_inflight.h - the batches one relay stream has sent and still waits on: each is
// answered when the next stage's response names its batch_id, or failed with the rest
// when the stream ends. Whatever carries the stream (gRPC or the local relay), this part
// is the same; it holds no socket and no channel, so it is tested without either.
#pragma once

#include "meshnet/shard/v1/shard_service.pb.h"

#include <grpcpp/support/status.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace meshnet {

namespace pb = ::meshnet::shard::v1;

// The next stage's answer to one relayed step: what its Forward would have answered.
struct relay_answer {
    grpc::Status        status;
    pb::ForwardResponse response;
};

// Called once per batch, with one answer per step in the batch's order, on a gRPC
// thread (or on the sending thread when the link is shutting down).
using relay_batch_done = std::function<void(std::vector<relay_answer> & answers)>;

// `n` answers that all fail with `status`.
std::vector<relay_answer> failed_answers(size_t n, const grpc::Status & status);

// Thread-safe; `done` is always called without the lock held, so it may send again.
class relay_inflight {
public:
    using clock = std::chrono::steady_clock;

    void add(uint64_t batch_id, size_t n_steps, relay_batch_done done, clock::time_point sent = clock::now());
    // Answers the batch `response` names (a step the response lacks fails with INTERNAL);
    // false when no batch of that id waits (never sent here, or answered already).
    bool answer(pb::RelayResponse & response);
    // Why the stream was ended on purpose; fail_all() uses it instead of its fallback.
    void set_ending_status(const grpc::Status & why);
    // The stream is over: every batch still waiting fails, with the ending status if one
    // was set, else with `fallback`.
    void fail_all(const grpc::Status & fallback);
    // When the oldest batch still waiting was sent (`now` when none waits).
    clock::time_point oldest(clock::time_point now) const;
    bool empty() const;

private:
    struct batch {
        size_t            n_steps = 0;
        relay_batch_done  done;
        clock::time_point sent;
    };

    mutable std::mutex        mutex_;
    std::map<uint64_t, batch> batches_;
    grpc::Status              ending_status_;
};

} // namespace meshnet
