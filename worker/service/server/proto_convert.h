// proto_convert.h - internal types to and from meshnet.shard.v1 messages: the boundary's
// dtype, schema and row shape, route keys, a Ring message's tokens, a stage's trace
// entry, status code names.
#pragma once

#include "boundary_codec.h"
#include "engine.h"
#include "ring.h"
#include "session_store.h"

#include "meshnet/shard/v1/shard_service.pb.h"

#include <grpcpp/support/status.h>

#include <cstdint>
#include <vector>

namespace meshnet {

namespace pb = ::meshnet::shard::v1;

pb::BoundaryDtype  dtype_to_pb(wire_dtype dtype);
pb::BoundarySchema schema_to_pb(boundary_schema schema);
// Shape of one token's boundary row: [n_embd], or [streams, n_embd] for the mHC residual.
std::vector<int64_t> row_shape(const engine_info & info);

session_key  key_of(const pb::RouteKey & key);
pb::RouteKey route_key_of(const session_key & key);
// The tokens a Ring message carries (`tokens`, or `token` alone from a last stage that
// sends only that).
window_tokens ring_tokens_of(const pb::RingResponse & token);

// `n_tokens` boundary rows (f32, as the engine left them) in `dtype` on the wire.
void boundary_to_pb(const engine_info & info, wire_dtype dtype, int64_t n_tokens, const std::vector<float> & rows,
                    pb::Boundary & out);
// A stage's entry in a step's chain trace.
void trace_to_pb(const engine_info & info, const std::string & incarnation, int64_t engine_micros,
                 pb::StageTrace & out);

const char * status_code_name(grpc::StatusCode code);

} // namespace meshnet
