// relay_stream.h - the receiving side of Relay: the previous stage's batches of relayed
// steps, each checked as Forward checks it, queued together so they share one engine
// step, and answered as one response once every step of the batch has its result.
#pragma once

#include "stage_core.h"

#include "meshnet/shard/v1/shard_service.grpc.pb.h"

namespace meshnet {

// A reactor for one Relay call; it deletes itself when the call is done.
grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> * relay_stream_open(stage_core & core);

} // namespace meshnet
