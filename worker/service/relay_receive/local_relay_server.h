// local_relay_server.h - Relay without gRPC for a previous stage on this host (see
// "Local relay" at Relay in shard_service.proto): frames over TCP on 127.0.0.1. One
// thread reads every connection as bytes arrive (an idle connection costs no thread and
// a frame's memory follows its bytes); answers are written by the thread that finishes
// them (the engine thread), so a token's hand-off wakes no other thread here.
// A connection must open with this worker's token, derived from the route key and the
// worker's incarnation (route_key.h): only holders of the key can open it, as only they
// may call Relay on the gRPC port.
#pragma once

#include "stage_core.h"

#include <chrono>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace meshnet {

struct local_relay_limits {
    size_t                    max_frame_bytes = 0;
    int                       max_connections = 16; // more are closed as they come
    std::chrono::milliseconds token_timeout{2000};  // to send the token, from connecting
    // A connection with nothing to answer that sent nothing for this long is closed: a
    // peer that knows the token could otherwise hold every connection there is.
    std::chrono::milliseconds idle_timeout{60000};
};

class local_relay_server {
public:
    // `token`: what a connection must open with (route_key::local_relay_token).
    explicit local_relay_server(std::string token);
    ~local_relay_server();
    local_relay_server(const local_relay_server &) = delete;
    local_relay_server & operator=(const local_relay_server &) = delete;

    // Binds 127.0.0.1 on any free port; false with `error` when it cannot.
    bool listen(std::string & error);
    int port() const { return port_; }
    // Takes connections for `core`.
    void start(stage_core & core, local_relay_limits limits);
    // Takes no more connections and closes the open ones once their batches are
    // answered (stop the scheduler first: it answers every step still queued).
    void stop();

private:
    struct connection;
    void poll_loop();
    void accept_one();
    void read_from(connection & peer);
    void end(connection & peer);
    void reap(bool all);

    stage_core *       core_ = nullptr;
    local_relay_limits limits_;
    std::string        token_;
    int                listen_fd_ = -1;
    int                port_      = 0;
    int                wake_fd_   = -1; // stop() writes here so the poll returns at once
    std::thread        poller_;
    std::list<std::unique_ptr<connection>> connections_; // the poller's alone
    std::mutex         mutex_;
    bool               stopping_ = false;
};

} // namespace meshnet
