// local_relay_server.cpp - the local relay's accepting side.
#include "local_relay_server.h"
#include "relay_batches.h"
#include "rate_limited_log.h"
#include "relay_frames.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace meshnet {

namespace {

// A previous stage that stops reading fails the write after this long (its connection
// ends, as a broken gRPC stream would) instead of holding the engine thread.
constexpr int send_timeout_ms = 10000;
// How often the poller looks at deadlines and connections to reap when nothing comes.
constexpr int poll_every_ms = 100;
constexpr size_t read_chunk_bytes = 64 * 1024;

using relay_clock = std::chrono::steady_clock;

void log_refusal(const char * why) {
    static rate_limited_log log("local relay");
    log.say(std::string("closed a connection: ") + why);
}

} // namespace

struct local_relay_server::connection {
    connection(int socket, stage_core & core, size_t max_frame_bytes)
        : fd(socket), opened(relay_clock::now()), heard(opened), frames(max_frame_bytes),
          batches(core, true, [this](pb::RelayResponse && response) { answered(response); }) {}

    void answered(const pb::RelayResponse & response) {
        {
            std::lock_guard<std::mutex> lock(write_mutex);
            if (!broken && !write_frame(fd, response)) {
                broken = true;
                shutdown(fd, SHUT_RDWR); // the poller sees the end and cancels the rest
            }
        }
        --unanswered; // last: once it is 0 the poller may free this connection
    }

    int                     fd;
    relay_clock::time_point opened;
    relay_clock::time_point heard; // its last bytes, or its last step in flight
    std::string             token; // what came of it so far
    bool                    trusted = false;
    bool                    ended   = false; // no more reading; closed once all is answered
    frame_reader            frames;
    relay_batches           batches;
    std::mutex              write_mutex; // one frame at a time
    bool                    broken = false;
    std::atomic<int>        unanswered{0};
};

local_relay_server::local_relay_server(std::string token) : token_(std::move(token)) {}

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

void local_relay_server::start(stage_core & core, local_relay_limits limits) {
    core_ = &core;
    limits_  = limits;
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    poller_  = std::thread([this] { poll_loop(); });
}

void local_relay_server::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) {
            return;
        }
        stopping_ = true;
    }
    if (wake_fd_ >= 0) {
        const uint64_t one = 1;
        (void) !write(wake_fd_, &one, sizeof one);
    }
    if (poller_.joinable()) {
        poller_.join();
    }
    if (wake_fd_ >= 0) {
        close(wake_fd_);
        wake_fd_ = -1;
    }
    if (listen_fd_ >= 0) {
        close(listen_fd_);
        listen_fd_ = -1;
    }
}

void local_relay_server::poll_loop() {
    std::vector<pollfd>       watched;
    std::vector<connection *> peers; // peers[i] is watched[i + 2]
    while (true) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_) {
                break;
            }
        }
        watched.assign({ pollfd{listen_fd_, POLLIN, 0}, pollfd{wake_fd_, POLLIN, 0} });
        peers.clear();
        for (auto & peer : connections_) {
            if (!peer->ended) {
                watched.push_back(pollfd{peer->fd, POLLIN, 0});
                peers.push_back(peer.get());
            }
        }
        const int ready = poll(watched.data(), watched.size(), poll_every_ms);
        if (ready < 0 && errno != EINTR) {
            std::perror("meshnet-shard-worker: local relay: poll");
            break;
        }
        for (size_t i = 0; ready > 0 && i < peers.size(); ++i) {
            if (watched[i + 2].revents != 0) {
                read_from(*peers[i]);
            }
        }
        if (ready > 0 && (watched[0].revents & POLLIN) != 0) {
            accept_one();
        }
        const auto now = relay_clock::now();
        for (auto & peer : connections_) {
            if (!peer->ended && !peer->trusted && now - peer->opened > limits_.token_timeout) {
                log_refusal("no token in time");
                end(*peer);
            } else if (!peer->ended && peer->unanswered.load() > 0) {
                peer->heard = now; // a long step is no silence: idle counts from its answer
            } else if (!peer->ended && now - peer->heard > limits_.idle_timeout) {
                log_refusal("idle (nothing sent within --local-relay-idle-ms)");
                end(*peer);
            }
        }
        reap(false);
    }
    // Stopping: the reading ends everywhere; each connection closes once answered (the
    // scheduler, stopped first, answered or cancelled every step still queued).
    for (auto & peer : connections_) {
        if (!peer->ended) {
            end(*peer);
        }
    }
    reap(true);
}

void local_relay_server::accept_one() {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) { // one that failed before we took it, or no descriptors left
        return;
    }
    int open = 0;
    for (auto & peer : connections_) {
        open += peer->ended ? 0 : 1;
    }
    if (open >= limits_.max_connections) {
        log_refusal("too many connections");
        close(fd);
        return;
    }
    prepare_connection(fd, send_timeout_ms);
    connections_.push_back(std::make_unique<connection>(fd, *core_, limits_.max_frame_bytes));
}

void local_relay_server::read_from(connection & peer) {
    char chunk[read_chunk_bytes];
    const ssize_t got = recv(peer.fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return;
    }
    if (got <= 0) { // the previous stage closed (or broke) the connection
        end(peer);
        return;
    }
    peer.heard = relay_clock::now();
    size_t used = 0;
    if (!peer.trusted) {
        used = std::min(local_relay_token_bytes - peer.token.size(), static_cast<size_t>(got));
        peer.token.append(chunk, used);
        if (peer.token.size() < local_relay_token_bytes) {
            return;
        }
        if (!same_token(peer.token, token_)) {
            log_refusal("wrong token");
            end(peer);
            return;
        }
        peer.trusted = true;
    }
    peer.frames.feed(chunk + used, static_cast<size_t>(got) - used);
    std::string body;
    while (true) {
        const auto next = peer.frames.next(body);
        if (next == frame_reader::result::more) {
            return;
        }
        pb::RelayRequest request;
        if (next == frame_reader::result::bad || !request.ParseFromString(body)) {
            end(peer); // a frame we cannot take: the stream cannot go on
            return;
        }
        ++peer.unanswered;
        peer.batches.take(request); // take() copied what the steps need out of request
    }
}

void local_relay_server::end(connection & peer) {
    // As a cancelled stream: the steps still queued release their sessions. Their
    // answers go nowhere.
    peer.ended = true;
    peer.batches.cancel();
    shutdown(peer.fd, SHUT_RDWR);
}

void local_relay_server::reap(bool all) {
    do {
        for (auto it = connections_.begin(); it != connections_.end();) {
            connection & peer = **it;
            if (peer.ended && peer.unanswered.load() == 0) {
                close(peer.fd);
                it = connections_.erase(it);
            } else {
                ++it;
            }
        }
        if (all && !connections_.empty()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    } while (all && !connections_.empty());
}

} // namespace meshnet
