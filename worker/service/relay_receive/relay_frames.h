// relay_frames.h - the local relay's wire (see Relay in shard_service.proto): protobuf
// messages as frames on a TCP connection over 127.0.0.1, each its byte length as a
// 4-byte little-endian integer and then the serialized message. A connection opens with
// the receiving worker's token (route_key::local_relay_token) before its first frame.
#pragma once

#include <google/protobuf/message_lite.h>

#include <cstddef>
#include <string>

namespace meshnet {

// A socket listening on 127.0.0.1:port (0: any free port), or -1 with `error`.
int listen_loopback(int port, std::string & error);
// The port a listening socket is bound to (0 when unknown).
int bound_port(int fd);
// A connected socket to 127.0.0.1:port, or -1 with `error`. Writes that the peer does
// not take within `send_timeout_ms` fail (a peer that stopped reading).
int connect_loopback(int port, int send_timeout_ms, std::string & error);
// Sets what every accepted connection needs (no Nagle delay, the send timeout).
void prepare_connection(int fd, int send_timeout_ms);

// The bytes of a local relay token.
constexpr size_t local_relay_token_bytes = 32;
// Whether `given` is `token`, in time that does not depend on where they differ.
bool same_token(const std::string & given, const std::string & token);
// Writes `token` on a connection just opened; false when the connection failed.
bool write_token(int fd, const std::string & token);

// Frames cut from a connection's bytes as they come: it holds only bytes that arrived,
// so a header announcing a large frame costs nothing until its body does.
class frame_reader {
public:
    enum class result { more, frame, bad };

    explicit frame_reader(size_t max_bytes) : max_bytes_(max_bytes) {}
    // Takes bytes read from the connection.
    void feed(const char * data, size_t size);
    // The next whole frame's body into `body` (frame); more: none is whole yet; bad: the
    // next frame announces more than max_bytes (the connection cannot go on).
    result next(std::string & body);
    // Bytes held (a frame's part, or whole frames not yet taken).
    size_t held() const { return buffer_.size() - start_; }

private:
    size_t      max_bytes_;
    std::string buffer_;
    size_t      start_ = 0; // bytes before it were taken
};

// Writes one frame; false when the connection failed (or timed out).
bool write_frame(int fd, const google::protobuf::MessageLite & message);
// Reads one frame into `message`; false at the end of the connection, on a failure, on
// a frame over `max_bytes` or on one that does not parse. Memory grows with the bytes
// that arrive, not with what the header announces.
bool read_frame(int fd, google::protobuf::MessageLite & message, size_t max_bytes);

} // namespace meshnet
