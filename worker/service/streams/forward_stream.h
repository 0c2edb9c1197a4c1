// forward_stream.h - the ForwardStream RPC: steps over one long-lived stream, answered in
// order, and the decode loop a first stage runs by itself (see ForwardStream in
// shard_service.proto); cancelling the stream releases its sessions.
#pragma once

#include "stage_core.h"

#include "meshnet/shard/v1/shard_service.grpc.pb.h"

namespace meshnet {

// A reactor for one ForwardStream call; it deletes itself when the call is done.
grpc::ServerBidiReactor<pb::ForwardStreamRequest, pb::ForwardStreamResponse> * forward_stream_open(
    stage_core & core);

} // namespace meshnet
