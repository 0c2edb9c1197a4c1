// step_checks.h - whether a stage can run a ForwardRequest, decided from the request and
// the stage's facts alone (no session, engine or metrics), so that each rejection reason
// is a row of a table test.
#pragma once

#include "boundary_codec.h"
#include "engine.h"
#include "error_info.h"

#include "meshnet/shard/v1/shard_service.pb.h"

#include <cstdint>
#include <optional>
#include <string>

namespace meshnet {

namespace pb = ::meshnet::shard::v1;

// What a step is checked against: the engine's layers and vocabulary, the route the
// worker serves, and its limits.
struct stage_facts {
    engine_info info;
    std::string route_id;
    uint64_t    epoch             = 0;
    wire_dtype  boundary_dtype    = wire_dtype::f32;
    int64_t     max_message_bytes = 64ll << 20;
    int32_t     max_step_tokens   = 512;
    bool        has_next_stage    = false; // started with --next-stage: it can relay
};

// A RouteKey names a session of this worker's route and epoch.
std::optional<shard_error> check_route_key(const pb::RouteKey & key, const stage_facts & stage);

// Every check of a step before it is queued, in the order the errors are answered:
// size, key, layers, positions, discard, context, tokens, boundary (all but its values,
// which decoding checks), output, the answer's size, speculative loop, decode loop.
// `streaming`: the step came on ForwardStream.
std::optional<shard_error> check_step(const pb::ForwardRequest & request, const stage_facts & stage,
                                      bool streaming);

} // namespace meshnet
