// route_key.h - the route's shared secret (--route-key-file): 32 random bytes the operator
// (or `meshnet up`) gives every stage of a route, its gateway/driver and certification.
// Holders prove it per call with a proof derived from it (the key itself never travels),
// and a stage's local relay opens with a token derived from it and the stage's
// incarnation. See "Route key" at ShardService in shard_service.proto.
#pragma once

#include <string>

namespace meshnet {

// The gRPC metadata key a caller's proof travels in.
inline constexpr const char * route_auth_metadata = "meshnet-route-auth";

class route_key {
public:
    route_key() = default;

    // Reads the file: 64 hex digits (32 bytes), surrounding whitespace ignored. False with
    // `error` for a missing file or any other content.
    static bool load(const std::string & path, route_key & key, std::string & error);
    // From the raw bytes (tests).
    static route_key of_bytes(std::string secret);

    bool present() const { return !secret_.empty(); }
    // What a holder sends in `meshnet-route-auth`: hex(HMAC-SHA256(key, "meshnet-route-auth-v1")).
    const std::string & proof() const { return proof_; }
    // True when `offered` is the proof; the comparison takes the same time wherever they differ.
    bool accepts(const std::string & offered) const;
    // What a connection to the local relay of the worker with `incarnation` opens with (32
    // bytes): HMAC-SHA256(key, "meshnet-local-relay-v1" || incarnation).
    std::string local_relay_token(const std::string & incarnation) const;

private:
    std::string secret_;
    std::string proof_;
};

} // namespace meshnet
