// relay_batches.h - the receiving side of Relay whatever carries it (the gRPC stream or
// the local relay): each batch of relayed steps checked as Forward checks it, queued
// together so they share one engine step, and answered as one response once every step
// of the batch has its result.
#pragma once

#include "stage_core.h"

#include <atomic>
#include <functional>

namespace meshnet {

class relay_batches {
public:
    // `answer` gets each batch's response, on the thread that answered its last step
    // (the engine thread, or the caller of take()). The owner keeps this object until
    // every batch taken was answered.
    relay_batches(stage_core & core, bool local, std::function<void(pb::RelayResponse &&)> answer);

    // Checks and queues the steps of one request (read from the previous stage).
    void take(const pb::RelayRequest & request);
    // The previous stage is gone: steps not yet run release their sessions instead.
    void cancel() { cancelled_ = true; }

private:
    struct pending_batch;
    void answered(pending_batch & batch, int i, const grpc::Status & status);

    stage_core &                              core_;
    const bool                                local_; // carried by the local relay (metrics)
    std::function<void(pb::RelayResponse &&)> answer_;
    std::atomic<bool>                         cancelled_{false};
};

} // namespace meshnet
