// error_info.h - the fixed set of ErrorInfo reasons (proto ErrorReason) and the
// gRPC statuses that carry them as a google.rpc.Status payload.
#pragma once

#include <grpcpp/support/status.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace meshnet {

// Mirrors meshnet.shard.v1.ErrorReason; the wire string is the name without prefix.
enum class error_reason {
    epoch_mismatch,
    cache_miss,
    range_mismatch,
    boundary_schema_mismatch,
    invalid_boundary,
    capacity_exhausted,
    session_cancelled,
    route_mismatch,
    invalid_positions,
    invalid_tokens,
    invalid_output_request,
    context_overflow,
    message_too_large,
    step_too_large,
    no_vocabulary,
    engine_failure,
    invalid_route_key,
    relay_unavailable,
    duplicate_session,
    malformed_request,
    discard_unsupported,
    ring_unavailable,
    discard_too_deep,
    response_too_large,
    step_superseded,
    invalid_text_ranges,
    route_key_missing,
    route_key_mismatch,
    invalid_boundary_encoding,
};

extern const char * const error_domain; // "shard.meshnet.dev"

const char *     error_reason_name(error_reason reason);
grpc::StatusCode error_reason_code(error_reason reason);

struct shard_error {
    error_reason reason;
    std::string  message;
    std::vector<std::pair<std::string, std::string>> metadata;
};

shard_error make_error(error_reason reason, std::string message,
                       std::vector<std::pair<std::string, std::string>> metadata = {});

// A status with the reason's code, the message, and google.rpc.Status{ErrorInfo}.
grpc::Status error_status(const shard_error & error);

// Reads the ErrorInfo back (tests and C++ clients); false when there is none.
bool error_info_decode(const grpc::Status & status, std::string & reason,
                       std::map<std::string, std::string> & metadata);

} // namespace meshnet
