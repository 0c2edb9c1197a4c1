// metrics.cpp - Prometheus text exposition format 0.0.4, written by hand (no client
// library in the Debian set), served by one thread that reads every open scrape as its
// bytes come.
#include "metrics.h"
#include "error_info.h"
#include "proto_convert.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

namespace meshnet {

seconds_histogram::seconds_histogram(std::vector<double> bounds_in)
    : bounds(std::move(bounds_in)), counts(bounds.size(), 0) {}

void seconds_histogram::observe(double seconds) {
    for (size_t i = 0; i < bounds.size(); ++i) {
        if (seconds <= bounds[i]) {
            counts[i]++;
        }
    }
    sum += seconds;
    count++;
}

void seconds_histogram::render(std::ostringstream & out, const char * name, const char * help) const {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
    for (size_t i = 0; i < bounds.size(); ++i) {
        out << name << "_bucket{le=\"" << bounds[i] << "\"} " << counts[i] << '\n';
    }
    out << name << "_bucket{le=\"+Inf\"} " << count << '\n'
        << name << "_sum " << sum << '\n'
        << name << "_count " << count << '\n';
}

static double unix_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

metrics_registry::metrics_registry()
    : forward_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0}),
      // A hop on one host costs tens of microseconds, over a WAN tens of milliseconds.
      next_hop_({0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0}),
      draft_({0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0}),
      start_time_(unix_now()) {}

void metrics_registry::count_request(const std::string & rpc, const std::string & code) {
    std::lock_guard<std::mutex> lock(mutex_);
    requests_[{rpc, code}]++;
}

void metrics_registry::count_answer(const std::string & rpc, const grpc::Status & status) {
    std::string reason;
    std::map<std::string, std::string> metadata;
    const bool has_reason = !status.ok() && error_info_decode(status, reason, metadata);
    std::lock_guard<std::mutex> lock(mutex_);
    requests_[{rpc, status_code_name(status.error_code())}]++;
    if (has_reason) {
        errors_[{rpc, reason}]++;
    }
}

void metrics_registry::add_boundary(bool out, boundary_encoding encoding, int64_t raw_bytes, int64_t wire_bytes) {
    const int way = out ? 1 : 0, packed = encoding == boundary_encoding::raw ? 0 : 1;
    boundary_raw_[way][packed] += raw_bytes;
    boundary_wire_[way][packed] += wire_bytes;
}

void metrics_registry::observe_forward_seconds(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    forward_.observe(seconds);
}

void metrics_registry::observe_next_hop_seconds(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    next_hop_.observe(seconds);
}

void metrics_registry::observe_draft_seconds(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    draft_.observe(seconds);
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
    out << "# HELP meshnet_shard_errors_total RPCs answered with an error, by method and ErrorInfo reason.\n"
        << "# TYPE meshnet_shard_errors_total counter\n";
    for (const auto & entry : errors_) {
        out << "meshnet_shard_errors_total{rpc=\"" << entry.first.first << "\",reason=\"" << entry.first.second
            << "\"} " << entry.second << '\n';
    }
    forward_.render(out, "meshnet_shard_forward_latency_seconds", "Forward step latency from arrival to answer.");
    next_hop_.render(out, "meshnet_shard_next_hop_seconds",
                     "Time the seam to the next stage added to a relayed step (round trip less the next stage's own).");
    draft_.render(out, "meshnet_shard_draft_seconds",
                  "Time the last stage's drafter took to draft the next window after a sampled step.");
    simple("meshnet_shard_tokens_processed_total", "counter", "Token positions run through this stage.", now.tokens_processed);
    simple("meshnet_shard_engine_steps_total", "counter", "Engine steps (each may batch several sessions).", now.engine_steps);
    char busy[32];
    std::snprintf(busy, sizeof(busy), "%.6f", static_cast<double>(now.engine_micros) * 1e-6);
    out << "# HELP meshnet_shard_engine_busy_seconds_total Time the engine spent in steps (its rate is the stage's utilisation).\n"
        << "# TYPE meshnet_shard_engine_busy_seconds_total counter\n"
        << "meshnet_shard_engine_busy_seconds_total " << busy << '\n';
    simple("meshnet_shard_superseded_steps_total", "counter",
           "Steps not run, or not relayed on, because a later step of their session discards their positions "
           "(a decode loop's windows voided at a rejection).", now.superseded_steps);
    simple("meshnet_shard_active_sessions", "gauge", "Sessions holding a slot.", now.active_sessions);
    simple("meshnet_shard_session_slots", "gauge", "Session slots in total.", now.slots_total);
    simple("meshnet_shard_kv_tokens_used", "gauge", "KV cells in use, all slots.", now.kv_tokens_used);
    // Not `_total`: that suffix is for counters, and this is a capacity gauge.
    simple("meshnet_shard_kv_tokens_capacity", "gauge", "KV cells in total, all slots.", now.kv_tokens_total);
    simple("meshnet_shard_queue_depth", "gauge", "Steps waiting for the engine.", now.queue_depth);
    simple("meshnet_shard_epoch", "gauge", "Route epoch this worker serves.", now.epoch);
    simple("meshnet_shard_prefix_lookups_total", "counter",
           "New sessions that asked to start from a cached prefix.", now.prefix_lookups);
    simple("meshnet_shard_prefix_hits_total", "counter",
           "New sessions that started from a cached prefix (hits / lookups: the hit ratio).", now.prefix_hits);
    simple("meshnet_shard_prefix_reused_tokens_total", "counter",
           "Prompt positions copied from a cached prefix instead of computed.", now.prefix_reused_tokens);
    simple("meshnet_shard_prefix_cache_entries", "gauge",
           "Released sessions' slots kept as prefix cache entries.", now.prefix_entries);
    simple("meshnet_shard_prefix_cache_bytes", "gauge",
           "KV bytes of the positions the prefix cache entries hold.", now.prefix_entry_bytes);
    simple("meshnet_shard_prefix_snapshots_skipped_total", "counter",
           "Snapshots a step asked for (deepseek4's whole-sequence entries) not kept: no slot "
           "free of live sessions, or not all of it fed on the grid.", now.prefix_snapshots_skipped);
    char started[32];
    std::snprintf(started, sizeof(started), "%.3f", start_time_);
    out << "# HELP meshnet_shard_start_time_seconds Unix time this worker (incarnation) started.\n"
        << "# TYPE meshnet_shard_start_time_seconds gauge\n"
        << "meshnet_shard_start_time_seconds " << started << '\n';
    const char * directions[2] = {"in", "out"};
    const char * encodings[2]  = {"raw", "shuffle_lz4"};
    out << "# HELP meshnet_shard_boundary_bytes_total Boundary payload bytes (raw, before any encoding), by direction.\n"
        << "# TYPE meshnet_shard_boundary_bytes_total counter\n";
    for (int way = 0; way < 2; ++way) {
        out << "meshnet_shard_boundary_bytes_total{direction=\"" << directions[way] << "\"} "
            << boundary_raw_[way][0].load() + boundary_raw_[way][1].load() << '\n';
    }
    out << "# HELP meshnet_shard_boundary_encoded_bytes_total Boundary bytes by direction and encoding: raw "
           "payload (kind=raw) and what went over the link (kind=wire); raw / wire is the compression ratio.\n"
        << "# TYPE meshnet_shard_boundary_encoded_bytes_total counter\n";
    for (int way = 0; way < 2; ++way) {
        for (int encoding = 0; encoding < 2; ++encoding) {
            const std::string labels = std::string("direction=\"") + directions[way] + "\",encoding=\"" +
                                       encodings[encoding] + "\"";
            out << "meshnet_shard_boundary_encoded_bytes_total{" << labels << ",kind=\"raw\"} "
                << boundary_raw_[way][encoding].load() << '\n'
                << "meshnet_shard_boundary_encoded_bytes_total{" << labels << ",kind=\"wire\"} "
                << boundary_wire_[way][encoding].load() << '\n';
        }
    }
    out << "# HELP meshnet_shard_boundary_decode_failures_total Boundaries refused because they did not unpack "
           "to the raw size and CRC-32 their sender stated (INVALID_BOUNDARY_ENCODING).\n"
        << "# TYPE meshnet_shard_boundary_decode_failures_total counter\n"
        << "meshnet_shard_boundary_decode_failures_total " << boundary_decode_failures_.load() << '\n';
    out << "# HELP meshnet_shard_relay_batches_total Batches of relayed steps taken from the previous stage, by transport.\n"
        << "# TYPE meshnet_shard_relay_batches_total counter\n"
        << "meshnet_shard_relay_batches_total{transport=\"grpc\"} " << relay_batches_grpc_.load() << '\n'
        << "meshnet_shard_relay_batches_total{transport=\"local\"} " << relay_batches_local_.load() << '\n';
    out << "# HELP meshnet_shard_draft_tokens_total Speculative draft tokens verified at this last stage, and those accepted.\n"
        << "# TYPE meshnet_shard_draft_tokens_total counter\n"
        << "meshnet_shard_draft_tokens_total{outcome=\"verified\"} " << drafts_verified_.load() << '\n'
        << "meshnet_shard_draft_tokens_total{outcome=\"accepted\"} " << drafts_accepted_.load() << '\n';
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

namespace {

using metrics_clock = std::chrono::steady_clock;

// Scrapes being read at once (the oldest gives way to a new one past this), the time a
// client has to send its whole request, and its most bytes: idle or slow connections
// can neither hold the port nor starve a scrape.
constexpr size_t metrics_max_open      = 64;
constexpr auto   metrics_request_time  = std::chrono::seconds(2);
constexpr size_t metrics_max_request   = 16384;
constexpr int    metrics_send_timeout_s = 2;

struct scrape {
    int                       fd;
    metrics_clock::time_point opened;
    std::string               request;
};

bool request_complete(const std::string & request) {
    return request.find("\r\n\r\n") != std::string::npos || request.size() >= metrics_max_request;
}

} // namespace

void metrics_server::answer(int fd, const std::string & request) {
    const bool is_metrics = request.rfind("GET /metrics ", 0) == 0 || request.rfind("GET /metrics?", 0) == 0;
    const bool is_health  = request.rfind("GET /health ", 0) == 0;
    const bool serving    = serving_.load();
    const std::string body = is_metrics ? render_()
                           : is_health  ? (serving ? "SERVING\n" : "NOT_SERVING\n")
                                        : "not found: try /metrics or /health\n";
    const char * status = is_metrics ? "200 OK"
                        : is_health  ? (serving ? "200 OK" : "503 Service Unavailable")
                                     : "404 Not Found";
    std::string response = std::string("HTTP/1.1 ") + status + "\r\n" +
        "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" +
        "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    size_t sent = 0;
    while (sent < response.size()) {
        const ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
    }
}

void metrics_server::serve() {
    std::vector<scrape> open, kept;
    std::vector<pollfd> watched;
    while (!stopping_) {
        watched.assign(1, pollfd{listen_fd_, POLLIN, 0});
        for (const scrape & s : open) {
            watched.push_back(pollfd{s.fd, POLLIN, 0});
        }
        const int ready = poll(watched.data(), watched.size(), 200);
        const auto now = metrics_clock::now();
        kept.clear();
        for (size_t i = 0; i < open.size(); ++i) {
            scrape & s = open[i];
            bool gone = false;
            if (ready > 0 && watched[i + 1].revents != 0) {
                char buffer[2048];
                const ssize_t n = recv(s.fd, buffer, sizeof buffer, MSG_DONTWAIT);
                if (n > 0) {
                    s.request.append(buffer, static_cast<size_t>(n));
                } else {
                    gone = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
                }
            }
            if (!gone && request_complete(s.request)) {
                answer(s.fd, s.request);
                gone = true;
            }
            if (gone || now - s.opened > metrics_request_time) {
                close(s.fd);
            } else {
                kept.push_back(std::move(s));
            }
        }
        open.swap(kept);
        if (ready > 0 && (watched[0].revents & POLLIN) != 0) {
            const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd >= 0) {
                timeval timeout{metrics_send_timeout_s, 0}; // a client that stops reading
                setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
                if (open.size() >= metrics_max_open) {
                    close(open.front().fd);
                    open.erase(open.begin());
                }
                open.push_back(scrape{fd, now, {}});
            }
        }
    }
    for (const scrape & s : open) {
        close(s.fd);
    }
}

} // namespace meshnet
