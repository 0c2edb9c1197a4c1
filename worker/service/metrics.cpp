// metrics.cpp - Prometheus text exposition format 0.0.4, written by hand (no client
// library in the Debian set), and a blocking accept loop polled for shutdown.
#include "metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <sstream>

namespace meshnet {

metrics_registry::metrics_registry()
    : bucket_bounds_{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0},
      bucket_counts_(bucket_bounds_.size(), 0) {}

void metrics_registry::count_request(const std::string & rpc, const std::string & code) {
    std::lock_guard<std::mutex> lock(mutex_);
    requests_[{rpc, code}]++;
}

void metrics_registry::observe_forward_seconds(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < bucket_bounds_.size(); ++i) {
        if (seconds <= bucket_bounds_[i]) {
            bucket_counts_[i]++;
        }
    }
    latency_sum_ += seconds;
    latency_count_++;
}

std::string metrics_registry::render(const gauges & now) const {
    std::ostringstream out;
    auto simple = [&](const char * name, const char * type, const char * help, int64_t value) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
            << name << ' ' << value << '\n';
    };
    std::lock_guard<std::mutex> lock(mutex_);
    out << "# HELP meshnet_shard_requests_total RPCs answered, by method and gRPC status code.\n"
        << "# TYPE meshnet_shard_requests_total counter\n";
    for (const auto & entry : requests_) {
        out << "meshnet_shard_requests_total{rpc=\"" << entry.first.first << "\",code=\"" << entry.first.second
            << "\"} " << entry.second << '\n';
    }
    out << "# HELP meshnet_shard_forward_latency_seconds Forward step latency from arrival to answer.\n"
        << "# TYPE meshnet_shard_forward_latency_seconds histogram\n";
    for (size_t i = 0; i < bucket_bounds_.size(); ++i) {
        out << "meshnet_shard_forward_latency_seconds_bucket{le=\"" << bucket_bounds_[i] << "\"} "
            << bucket_counts_[i] << '\n';
    }
    out << "meshnet_shard_forward_latency_seconds_bucket{le=\"+Inf\"} " << latency_count_ << '\n'
        << "meshnet_shard_forward_latency_seconds_sum " << latency_sum_ << '\n'
        << "meshnet_shard_forward_latency_seconds_count " << latency_count_ << '\n';
    simple("meshnet_shard_tokens_processed_total", "counter", "Token positions run through this stage.", now.tokens_processed);
    simple("meshnet_shard_engine_steps_total", "counter", "Engine steps (each may batch several sessions).", now.engine_steps);
    char busy[32];
    std::snprintf(busy, sizeof(busy), "%.6f", static_cast<double>(now.engine_micros) * 1e-6);
    out << "# HELP meshnet_shard_engine_busy_seconds_total Time the engine spent in steps (its rate is the stage's utilisation).\n"
        << "# TYPE meshnet_shard_engine_busy_seconds_total counter\n"
        << "meshnet_shard_engine_busy_seconds_total " << busy << '\n';
    simple("meshnet_shard_active_sessions", "gauge", "Sessions holding a slot.", now.active_sessions);
    simple("meshnet_shard_session_slots", "gauge", "Session slots in total.", now.slots_total);
    simple("meshnet_shard_kv_tokens_used", "gauge", "KV cells in use, all slots.", now.kv_tokens_used);
    simple("meshnet_shard_kv_tokens_total", "gauge", "KV cells in total, all slots.", now.kv_tokens_total);
    simple("meshnet_shard_queue_depth", "gauge", "Steps waiting for the engine.", now.queue_depth);
    out << "# HELP meshnet_shard_boundary_bytes_total Boundary payload bytes, by direction.\n"
        << "# TYPE meshnet_shard_boundary_bytes_total counter\n"
        << "meshnet_shard_boundary_bytes_total{direction=\"in\"} " << boundary_bytes_in_.load() << '\n'
        << "meshnet_shard_boundary_bytes_total{direction=\"out\"} " << boundary_bytes_out_.load() << '\n';
    out << "# HELP meshnet_shard_relay_batches_total Batches of relayed steps taken from the previous stage, by transport.\n"
        << "# TYPE meshnet_shard_relay_batches_total counter\n"
        << "meshnet_shard_relay_batches_total{transport=\"grpc\"} " << relay_batches_grpc_.load() << '\n'
        << "meshnet_shard_relay_batches_total{transport=\"local\"} " << relay_batches_local_.load() << '\n';
    return out.str();
}

bool split_host_port(const std::string & address, std::string & host, int & port) {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon + 1 >= address.size()) {
        return false;
    }
    host = address.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
    }
    try {
        size_t used = 0;
        port = std::stoi(address.substr(colon + 1), &used);
        return used == address.size() - colon - 1 && port >= 0 && port < 65536;
    } catch (...) {
        return false;
    }
}

metrics_server::~metrics_server() {
    stop();
}

bool metrics_server::start(const std::string & address, std::function<std::string()> render, std::string & error) {
    std::string host;
    int port = 0;
    if (!split_host_port(address, host, port)) {
        error = "metrics address must be HOST:PORT, got '" + address + "'";
        return false;
    }
    addrinfo hints{};
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo * found = nullptr;
    const std::string service = std::to_string(port);
    if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0 || !found) {
        error = "cannot resolve metrics address '" + address + "'";
        return false;
    }
    listen_fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool bound = listen_fd_ >= 0 && bind(listen_fd_, found->ai_addr, found->ai_addrlen) == 0 &&
                       listen(listen_fd_, 16) == 0;
    freeaddrinfo(found);
    if (!bound) {
        error = "cannot listen on metrics address '" + address + "': " + std::strerror(errno);
        if (listen_fd_ >= 0) close(listen_fd_);
        listen_fd_ = -1;
        return false;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    getsockname(listen_fd_, reinterpret_cast<sockaddr *>(&local), &len);
    port_ = ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&local)->sin6_port
                                              : reinterpret_cast<sockaddr_in *>(&local)->sin_port);
    render_ = std::move(render);
    thread_ = std::thread([this] { serve(); });
    return true;
}

void metrics_server::stop() {
    stopping_ = true;
    if (thread_.joinable()) {
        thread_.join();
    }
    if (listen_fd_ >= 0) {
        close(listen_fd_);
        listen_fd_ = -1;
    }
}

void metrics_server::serve() {
    while (!stopping_) {
        pollfd pfd{listen_fd_, POLLIN, 0};
        if (poll(&pfd, 1, 200) <= 0) {
            continue;
        }
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        timeval timeout{2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
        std::string request;
        char buffer[2048];
        while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
            const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
            if (n <= 0) break;
            request.append(buffer, static_cast<size_t>(n));
        }
        const bool is_metrics = request.rfind("GET /metrics ", 0) == 0 || request.rfind("GET /metrics?", 0) == 0;
        const std::string body = is_metrics ? render_() : "not found: try /metrics\n";
        std::string response = std::string("HTTP/1.1 ") + (is_metrics ? "200 OK" : "404 Not Found") + "\r\n" +
            "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" +
            "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
        size_t sent = 0;
        while (sent < response.size()) {
            const ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
            if (n <= 0) break;
            sent += static_cast<size_t>(n);
        }
        close(fd);
    }
}

} // namespace meshnet
