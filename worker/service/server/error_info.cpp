// error_info.cpp - encodes google.rpc.Status{details: [Any(google.rpc.ErrorInfo)]} by
// hand: the googleapis C++ protos are not packaged, and the wire format is tiny.
#include "error_info.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

namespace meshnet {

const char * const error_domain = "shard.meshnet.dev";

static const char * const error_info_type_url = "type.googleapis.com/google.rpc.ErrorInfo";

const char * error_reason_name(error_reason reason) {
    switch (reason) {
        case error_reason::epoch_mismatch:           return "EPOCH_MISMATCH";
        case error_reason::cache_miss:               return "CACHE_MISS";
        case error_reason::range_mismatch:           return "RANGE_MISMATCH";
        case error_reason::boundary_schema_mismatch: return "BOUNDARY_SCHEMA_MISMATCH";
        case error_reason::invalid_boundary:         return "INVALID_BOUNDARY";
        case error_reason::capacity_exhausted:       return "CAPACITY_EXHAUSTED";
        case error_reason::session_cancelled:        return "SESSION_CANCELLED";
        case error_reason::route_mismatch:           return "ROUTE_MISMATCH";
        case error_reason::invalid_positions:        return "INVALID_POSITIONS";
        case error_reason::invalid_tokens:           return "INVALID_TOKENS";
        case error_reason::invalid_output_request:   return "INVALID_OUTPUT_REQUEST";
        case error_reason::context_overflow:         return "CONTEXT_OVERFLOW";
        case error_reason::message_too_large:        return "MESSAGE_TOO_LARGE";
        case error_reason::step_too_large:           return "STEP_TOO_LARGE";
        case error_reason::no_vocabulary:            return "NO_VOCABULARY";
        case error_reason::engine_failure:           return "ENGINE_FAILURE";
        case error_reason::invalid_route_key:        return "INVALID_ROUTE_KEY";
        case error_reason::relay_unavailable:        return "RELAY_UNAVAILABLE";
        case error_reason::duplicate_session:        return "DUPLICATE_SESSION";
        case error_reason::malformed_request:        return "MALFORMED_REQUEST";
        case error_reason::discard_unsupported:      return "DISCARD_UNSUPPORTED";
        case error_reason::ring_unavailable:         return "RING_UNAVAILABLE";
        case error_reason::discard_too_deep:         return "DISCARD_TOO_DEEP";
        case error_reason::response_too_large:       return "RESPONSE_TOO_LARGE";
        case error_reason::step_superseded:          return "STEP_SUPERSEDED";
        case error_reason::invalid_text_ranges:      return "INVALID_TEXT_RANGES";
        case error_reason::route_key_missing:        return "ROUTE_KEY_MISSING";
        case error_reason::route_key_mismatch:       return "ROUTE_KEY_MISMATCH";
        case error_reason::invalid_boundary_encoding: return "INVALID_BOUNDARY_ENCODING";
    }
    return "UNSPECIFIED";
}

grpc::StatusCode error_reason_code(error_reason reason) {
    switch (reason) {
        case error_reason::epoch_mismatch:
        case error_reason::cache_miss:
        case error_reason::range_mismatch:
        case error_reason::route_mismatch:
        case error_reason::no_vocabulary:
        case error_reason::relay_unavailable:
        case error_reason::discard_unsupported:
        case error_reason::ring_unavailable:
        case error_reason::discard_too_deep:
            return grpc::StatusCode::FAILED_PRECONDITION;
        case error_reason::boundary_schema_mismatch:
        case error_reason::invalid_boundary:
        case error_reason::invalid_boundary_encoding:
        case error_reason::invalid_positions:
        case error_reason::invalid_tokens:
        case error_reason::invalid_output_request:
        case error_reason::step_too_large:
        case error_reason::invalid_route_key:
        case error_reason::duplicate_session:
        case error_reason::malformed_request:
        case error_reason::response_too_large:
        case error_reason::invalid_text_ranges:
            return grpc::StatusCode::INVALID_ARGUMENT;
        case error_reason::context_overflow:
            return grpc::StatusCode::OUT_OF_RANGE;
        case error_reason::capacity_exhausted:
        case error_reason::message_too_large:
            return grpc::StatusCode::RESOURCE_EXHAUSTED;
        case error_reason::session_cancelled:
            return grpc::StatusCode::CANCELLED;
        case error_reason::engine_failure:
            return grpc::StatusCode::INTERNAL;
        case error_reason::step_superseded:
            return grpc::StatusCode::ABORTED;
        case error_reason::route_key_missing:
            return grpc::StatusCode::UNAUTHENTICATED;
        case error_reason::route_key_mismatch:
            return grpc::StatusCode::PERMISSION_DENIED;
    }
    return grpc::StatusCode::UNKNOWN;
}

shard_error make_error(error_reason reason, std::string message,
                       std::vector<std::pair<std::string, std::string>> metadata) {
    return shard_error{reason, std::move(message), std::move(metadata)};
}

namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;
using google::protobuf::internal::WireFormatLite;

// Appends field `number` as a length-delimited value.
void put_bytes(std::string & out, int number, const std::string & value) {
    StringOutputStream stream(&out);
    CodedOutputStream coded(&stream);
    coded.WriteTag(WireFormatLite::MakeTag(number, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint32(static_cast<uint32_t>(value.size()));
    coded.WriteString(value);
}

std::string encode_error_info(const shard_error & error) {
    std::string info;
    put_bytes(info, 1, error_reason_name(error.reason));
    put_bytes(info, 2, error_domain);
    for (const auto & kv : error.metadata) {
        std::string entry;
        put_bytes(entry, 1, kv.first);
        put_bytes(entry, 2, kv.second);
        put_bytes(info, 3, entry);
    }
    return info;
}

std::string encode_status(int code, const std::string & message, const std::string & error_info) {
    std::string any;
    put_bytes(any, 1, error_info_type_url);
    put_bytes(any, 2, error_info);
    std::string status;
    {
        StringOutputStream stream(&status);
        CodedOutputStream coded(&stream);
        coded.WriteTag(WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_VARINT));
        coded.WriteVarint64(static_cast<uint64_t>(static_cast<int64_t>(code)));
    }
    put_bytes(status, 2, message);
    put_bytes(status, 3, any);
    return status;
}

// Calls `on_field(number, bytes)` for every length-delimited field; skips varints.
template <typename F>
bool for_each_bytes_field(const std::string & data, F on_field) {
    CodedInputStream in(reinterpret_cast<const uint8_t *>(data.data()), static_cast<int>(data.size()));
    while (true) {
        const uint32_t tag = in.ReadTag();
        if (tag == 0) {
            return true;
        }
        const int number = WireFormatLite::GetTagFieldNumber(tag);
        switch (WireFormatLite::GetTagWireType(tag)) {
            case WireFormatLite::WIRETYPE_VARINT: {
                uint64_t ignored;
                if (!in.ReadVarint64(&ignored)) return false;
                break;
            }
            case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
                uint32_t size;
                std::string value;
                if (!in.ReadVarint32(&size) || !in.ReadString(&value, static_cast<int>(size))) return false;
                on_field(number, value);
                break;
            }
            default:
                return false;
        }
    }
}

} // namespace

grpc::Status error_status(const shard_error & error) {
    const grpc::StatusCode code = error_reason_code(error.reason);
    const std::string message = std::string(error_reason_name(error.reason)) + ": " + error.message;
    return grpc::Status(code, message, encode_status(static_cast<int>(code), message, encode_error_info(error)));
}

bool error_info_decode(const grpc::Status & status, std::string & reason,
                       std::map<std::string, std::string> & metadata) {
    bool found = false;
    for_each_bytes_field(status.error_details(), [&](int number, const std::string & any) {
        if (number != 3) return;
        std::string type_url, value;
        for_each_bytes_field(any, [&](int n, const std::string & v) {
            if (n == 1) type_url = v;
            if (n == 2) value = v;
        });
        if (type_url != error_info_type_url) return;
        found = true;
        for_each_bytes_field(value, [&](int n, const std::string & v) {
            if (n == 1) reason = v;
            if (n == 3) {
                std::string key, val;
                for_each_bytes_field(v, [&](int m, const std::string & w) {
                    if (m == 1) key = w;
                    if (m == 2) val = w;
                });
                metadata[key] = val;
            }
        });
    });
    return found;
}

} // namespace meshnet
