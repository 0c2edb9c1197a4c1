// malformed_requests.h - a unary request whose bytes do not parse as its method's
// message. gRPC's callback API answers it UNIMPLEMENTED with no message before any of
// our code runs; this server interceptor turns that answer into the protocol's
// INVALID_ARGUMENT / MALFORMED_REQUEST and logs it (rate-limited).
//
// Streams are not covered: a stream message that does not parse looks to the reactor
// like the client's half-close, so it ends that stream (documented at the reason).
//
// protobuf itself logs a line for some bytes that do not parse (a string field that is
// not UTF-8); rate_limit_protobuf_log sends those through a rate-limited log as well.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

namespace meshnet {

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> malformed_request_interceptors();

// From now on protobuf's log lines, but for fatal ones, are rate-limited (process-wide).
void rate_limit_protobuf_log();

} // namespace meshnet
