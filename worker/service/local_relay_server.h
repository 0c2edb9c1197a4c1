// local_relay_server.h - Relay without gRPC for a previous stage on this host (see
// "Local relay" at Relay in shard_service.proto): frames over TCP on 127.0.0.1, one
// thread per connection reading batches; answers are written by the thread that
// finishes them (the engine thread), so a token's hand-off wakes no other thread here.
#pragma once

#include "shard_service.h"

#include <condition_variable>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace meshnet {

class local_relay_server {
public:
    local_relay_server();
    ~local_relay_server();
    local_relay_server(const local_relay_server &) = delete;
    local_relay_server & operator=(const local_relay_server &) = delete;

    // Binds 127.0.0.1 on any free port; false with `error` when it cannot.
    bool listen(std::string & error);
    int port() const { return port_; }
    // Takes connections for `service`, each frame at most `max_frame_bytes`.
    void start(shard_service & service, size_t max_frame_bytes);
    // Takes no more connections and closes the open ones once their batches are
    // answered (stop the scheduler first: it answers every step still queued).
    void stop();

private:
    struct connection;
    void accept_loop();
    void serve(connection & peer);

    shard_service *  service_         = nullptr;
    size_t           max_frame_bytes_ = 0;
    int              listen_fd_       = -1;
    int              port_            = 0;
    std::thread      acceptor_;
    std::mutex       mutex_;
    std::list<std::unique_ptr<connection>> connections_;
    bool             stopping_ = false;
};

} // namespace meshnet
