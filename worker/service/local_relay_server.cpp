// local_relay_server.cpp - the local relay's accepting side.
#include "local_relay_server.h"
#include "relay_batches.h"
#include "relay_frames.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

namespace meshnet {

namespace {

// A previous stage that stops reading fails the write after this long (its connection
// ends, as a broken gRPC stream would) instead of holding the engine thread.
constexpr int send_timeout_ms = 10000;

} // namespace

struct local_relay_server::connection {
    connection(int socket, shard_service & service)
        : fd(socket), batches(service, true, [this](pb::RelayResponse && response) { answered(response); }) {}

    void answered(const pb::RelayResponse & response) {
        {
            std::lock_guard<std::mutex> lock(write_mutex);
            if (!broken && !write_frame(fd, response)) {
                broken = true;
                shutdown(fd, SHUT_RDWR); // the reader sees the end and cancels the rest
            }
        }
        std::lock_guard<std::mutex> lock(mutex);
        --unanswered;
        all_answered.notify_all();
    }

    int                     fd;
    relay_batches           batches;
    std::mutex              write_mutex; // one frame at a time
    bool                    broken = false;
    std::mutex              mutex;
    std::condition_variable all_answered;
    int                     unanswered = 0;
    bool                    done       = false;
    std::thread             reader;
};

local_relay_server::local_relay_server() = default;

local_relay_server::~local_relay_server() {
    stop();
}

bool local_relay_server::listen(std::string & error) {
    listen_fd_ = listen_loopback(0, error);
    if (listen_fd_ < 0) {
        return false;
    }
    port_ = bound_port(listen_fd_);
    return port_ != 0;
}

void local_relay_server::start(shard_service & service, size_t max_frame_bytes) {
    service_         = &service;
    max_frame_bytes_ = max_frame_bytes;
    acceptor_        = std::thread([this] { accept_loop(); });
}

void local_relay_server::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) {
            return;
        }
        stopping_ = true;
        for (auto & peer : connections_) {
            shutdown(peer->fd, SHUT_RDWR); // its reader ends
        }
    }
    if (listen_fd_ >= 0) {
        shutdown(listen_fd_, SHUT_RDWR); // accept() returns
    }
    if (acceptor_.joinable()) {
        acceptor_.join();
    }
    for (auto & peer : connections_) { // the acceptor is gone: nobody else touches the list
        if (peer->reader.joinable()) {
            peer->reader.join();
        }
        close(peer->fd);
    }
    connections_.clear();
    if (listen_fd_ >= 0) {
        close(listen_fd_);
        listen_fd_ = -1;
    }
}

void local_relay_server::accept_loop() {
    while (true) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) { // stopping, a connection that failed before we took it, or no descriptors
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_) {
                return;
            }
        }
        if (fd < 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) {
            close(fd);
            return;
        }
        prepare_connection(fd, send_timeout_ms);
        // Connections that ended are reaped as new ones come.
        for (auto it = connections_.begin(); it != connections_.end();) {
            std::unique_lock<std::mutex> peer_lock((*it)->mutex);
            if ((*it)->done) {
                peer_lock.unlock();
                (*it)->reader.join();
                close((*it)->fd);
                it = connections_.erase(it);
            } else {
                ++it;
            }
        }
        connections_.push_back(std::make_unique<connection>(fd, *service_));
        connection & peer = *connections_.back();
        peer.reader = std::thread([this, &peer] { serve(peer); });
    }
}

void local_relay_server::serve(connection & peer) {
    pb::RelayRequest request;
    while (read_frame(peer.fd, request, max_frame_bytes_)) {
        {
            std::lock_guard<std::mutex> lock(peer.mutex);
            ++peer.unanswered;
        }
        peer.batches.take(request); // take() copied what the steps need out of request
    }
    // The previous stage closed (or broke) the connection: as a cancelled stream, the
    // steps still queued release their sessions. Their answers go nowhere.
    peer.batches.cancel();
    shutdown(peer.fd, SHUT_RDWR);
    std::unique_lock<std::mutex> lock(peer.mutex);
    peer.all_answered.wait(lock, [&] { return peer.unanswered == 0; });
    peer.done = true;
}

} // namespace meshnet
