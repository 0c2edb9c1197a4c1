// forward_stream.h - the ForwardStream RPC: steps over one long-lived stream, answered in
// order, and the decode loop a first stage runs by itself (see ForwardStream in
// shard_service.proto); cancelling the stream releases its sessions.
#pragma once

#include "shard_service.h"

namespace meshnet {

// A reactor for one ForwardStream call; it deletes itself when the call is done.
grpc::ServerBidiReactor<pb::ForwardStreamRequest, pb::ForwardStreamResponse> * forward_stream_open(
    shard_service & service);

} // namespace meshnet
