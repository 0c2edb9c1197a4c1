// proto_convert.cpp - see proto_convert.h.
#include "proto_convert.h"

namespace meshnet {

pb::BoundaryDtype dtype_to_pb(wire_dtype dtype) {
    switch (dtype) {
        case wire_dtype::f32:  return pb::BOUNDARY_DTYPE_F32;
        case wire_dtype::f16:  return pb::BOUNDARY_DTYPE_F16;
        case wire_dtype::bf16: return pb::BOUNDARY_DTYPE_BF16;
    }
    return pb::BOUNDARY_DTYPE_UNSPECIFIED;
}

pb::BoundarySchema schema_to_pb(boundary_schema schema) {
    return schema == boundary_schema::mhc_residual ? pb::BOUNDARY_SCHEMA_MHC_RESIDUAL
                                                   : pb::BOUNDARY_SCHEMA_DENSE_RESIDUAL;
}

std::vector<int64_t> row_shape(const engine_info & info) {
    if (info.schema == boundary_schema::mhc_residual && info.n_embd > 0) {
        return {info.boundary_row / info.n_embd, info.n_embd};
    }
    return {info.boundary_row};
}

session_key key_of(const pb::RouteKey & key) {
    return session_key{key.route_id(), key.epoch(), key.session_id()};
}

pb::RouteKey route_key_of(const session_key & key) {
    pb::RouteKey out;
    out.set_route_id(key.route_id);
    out.set_epoch(key.epoch);
    out.set_session_id(key.session_id);
    return out;
}

window_tokens ring_tokens_of(const pb::RingResponse & token) {
    window_tokens answer;
    answer.tokens.assign(token.tokens().begin(), token.tokens().end());
    if (answer.tokens.empty()) {
        answer.tokens.push_back(token.token());
    }
    answer.next_drafts.assign(token.next_drafts().begin(), token.next_drafts().end());
    return answer;
}

void boundary_to_pb(const engine_info & info, wire_dtype dtype, int64_t n_tokens, const std::vector<float> & rows,
                    pb::Boundary & out) {
    out.set_schema(schema_to_pb(info.schema));
    out.set_dtype(dtype_to_pb(dtype));
    out.add_shape(n_tokens);
    for (int64_t dim : row_shape(info)) out.add_shape(dim);
    boundary_encode(rows.data(), rows.size(), dtype, *out.mutable_data());
}

void trace_to_pb(const engine_info & info, const std::string & incarnation, int64_t engine_micros,
                 pb::StageTrace & out) {
    out.mutable_layers()->set_begin(info.layers.begin);
    out.mutable_layers()->set_end(info.layers.end);
    out.set_incarnation(incarnation);
    out.set_engine_micros(engine_micros);
}

const char * status_code_name(grpc::StatusCode code) {
    switch (code) {
        case grpc::StatusCode::OK:                  return "OK";
        case grpc::StatusCode::CANCELLED:           return "CANCELLED";
        case grpc::StatusCode::UNKNOWN:             return "UNKNOWN";
        case grpc::StatusCode::INVALID_ARGUMENT:    return "INVALID_ARGUMENT";
        case grpc::StatusCode::DEADLINE_EXCEEDED:   return "DEADLINE_EXCEEDED";
        case grpc::StatusCode::NOT_FOUND:           return "NOT_FOUND";
        case grpc::StatusCode::ALREADY_EXISTS:      return "ALREADY_EXISTS";
        case grpc::StatusCode::PERMISSION_DENIED:   return "PERMISSION_DENIED";
        case grpc::StatusCode::RESOURCE_EXHAUSTED:  return "RESOURCE_EXHAUSTED";
        case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
        case grpc::StatusCode::ABORTED:             return "ABORTED";
        case grpc::StatusCode::OUT_OF_RANGE:        return "OUT_OF_RANGE";
        case grpc::StatusCode::UNIMPLEMENTED:       return "UNIMPLEMENTED";
        case grpc::StatusCode::INTERNAL:            return "INTERNAL";
        case grpc::StatusCode::UNAVAILABLE:         return "UNAVAILABLE";
        case grpc::StatusCode::DATA_LOSS:           return "DATA_LOSS";
        case grpc::StatusCode::UNAUTHENTICATED:     return "UNAUTHENTICATED";
        default:                                    return "UNKNOWN";
    }
}

} // namespace meshnet
