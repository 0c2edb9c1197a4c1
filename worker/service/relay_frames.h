// relay_frames.h - the local relay's wire (see Relay in shard_service.proto): protobuf
// messages as frames on a TCP connection over 127.0.0.1, each its byte length as a
// 4-byte little-endian integer and then the serialized message.
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

// Writes one frame; false when the connection failed (or timed out).
bool write_frame(int fd, const google::protobuf::MessageLite & message);
// Reads one frame into `message`; false at the end of the connection, on a failure, on
// a frame over `max_bytes` or on one that does not parse.
bool read_frame(int fd, google::protobuf::MessageLite & message, size_t max_bytes);

} // namespace meshnet
