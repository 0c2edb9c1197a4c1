// fake_stages.h - fake stages served over real gRPC on 127.0.0.1, and the requests the
// service tests send them, and a scrape of their /metrics (test-shard-service.cpp and
// the test-service-*.cpp beside it).
#pragma once

#include "error_info.h"
#include "fake_engine.h"
#include "service_test.h"
#include "worker_server.h"

#include <grpcpp/grpcpp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace meshnet_test {

using namespace meshnet;
namespace pb = ::meshnet::shard::v1;

constexpr int32_t n_layer = 8;

// What a fake engine computes exactly: each row by itself, so every width the flags allow
// (its worker skips the start-up probe, whose steps would show in the engine's counts).
inline exactness fake_exactness(const worker_params & params) {
    exactness exact;
    exact.step_rows = std::min(params.exact_batch_rows, max_exact_step_rows);
    exact.batching  = exact.step_rows >= 2;
    exact.detail    = "fake engine: every row computed by itself";
    return exact;
}

// One fake stage served on an ephemeral loopback port.
struct stage {
    fake_engine                        engine;
    worker_server                      server;
    std::unique_ptr<pb::ShardService::Stub> stub;

    // `port` 0: an ephemeral one; `prepare` sets the engine up before it serves.
    stage(int32_t begin, int32_t end, worker_params params = {}, int port = 0,
          const std::function<void(fake_engine &)> & prepare = nullptr)
        : engine(n_layer, begin, end, params.n_slots, params.n_ctx) {
        if (prepare) {
            prepare(engine);
        }
        params.model_path     = "fake.gguf";
        params.route_id       = "test/route";
        params.epoch          = 3;
        params.listen         = "127.0.0.1:" + std::to_string(port);
        params.metrics_listen = "127.0.0.1:0";
        std::string error;
        if (!server.start(params, engine, error, {}, {}, fake_exactness(params))) {
            std::printf("  cannot start stage: %s\n", error.c_str());
            std::abort();
        }
        stub = pb::ShardService::NewStub(grpc::CreateChannel(
            "127.0.0.1:" + std::to_string(server.port()), grpc::InsecureChannelCredentials()));
    }
};

inline worker_params small(int32_t slots = 4, int32_t ctx = 64, int64_t evict_idle_ms = 1000) {
    worker_params params;
    params.n_slots       = slots;
    params.n_ctx         = ctx;
    params.evict_idle_ms = evict_idle_ms;
    return params;
}

inline pb::ForwardRequest tokens_request(const std::string & session, int64_t n_past, const std::vector<int32_t> & tokens) {
    pb::ForwardRequest request;
    request.mutable_key()->set_route_id("test/route");
    request.mutable_key()->set_epoch(3);
    request.mutable_key()->set_session_id(session);
    request.set_n_past(n_past);
    for (size_t i = 0; i < tokens.size(); ++i) {
        request.add_positions(static_cast<int32_t>(n_past + static_cast<int64_t>(i)));
        request.add_tokens(tokens[i]);
    }
    return request;
}

inline pb::ForwardRequest boundary_request(const std::string & session, int64_t n_past, const pb::Boundary & boundary) {
    pb::ForwardRequest request = tokens_request(session, n_past, {});
    for (int64_t i = 0; i < boundary.shape(0); ++i) {
        request.add_positions(static_cast<int32_t>(n_past + i));
    }
    *request.mutable_boundary() = boundary;
    return request;
}

inline grpc::Status forward(stage & s, const pb::ForwardRequest & request, pb::ForwardResponse & response) {
    grpc::ClientContext context;
    return s.stub->Forward(&context, request, &response);
}

inline std::string reason(const grpc::Status & status) {
    std::string r;
    std::map<std::string, std::string> metadata;
    error_info_decode(status, r, metadata);
    return r;
}

inline std::string metadata_of(const grpc::Status & status, const std::string & key) {
    std::string r;
    std::map<std::string, std::string> metadata;
    error_info_decode(status, r, metadata);
    return metadata[key];
}

// A first stage 0:4 and a last stage 4:8, the driver in between.
struct route {
    stage first{0, 4, small()};
    stage last{4, n_layer, small()};

    // Runs tokens through both stages and returns the greedy token after the last row.
    int32_t step(const std::string & session, int64_t n_past, const std::vector<int32_t> & tokens) {
        pb::ForwardResponse mid, out;
        const grpc::Status a = forward(first, tokens_request(session, n_past, tokens), mid);
        CHECK(a.ok());
        pb::ForwardRequest request = boundary_request(session, n_past, mid.boundary());
        request.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
        const grpc::Status b = forward(last, request, out);
        CHECK(b.ok());
        CHECK_EQ(out.sampled_tokens_size(), 1);
        CHECK_EQ(out.n_past(), n_past + static_cast<int64_t>(tokens.size()));
        return out.sampled_tokens_size() == 1 ? out.sampled_tokens(0) : -1;
    }
};

// Asserts a session that was fine before a bad request is still served correctly.
inline void check_serves(stage & first, const std::string & session, int64_t n_past) {
    pb::ForwardResponse response;
    const grpc::Status status = forward(first, tokens_request(session, n_past, {5}), response);
    CHECK(status.ok());
    CHECK_EQ(response.n_past(), n_past + 1);
}

// Makes a valid boundary for `n` rows as the first stage would.
inline pb::Boundary valid_boundary(int64_t n) {
    pb::Boundary boundary;
    boundary.set_schema(pb::BOUNDARY_SCHEMA_DENSE_RESIDUAL);
    boundary.set_dtype(pb::BOUNDARY_DTYPE_F32);
    boundary.add_shape(n);
    boundary.add_shape(fake_engine::fake_n_embd);
    std::vector<float> values(static_cast<size_t>(n * fake_engine::fake_n_embd), 1.0f);
    boundary.set_data(std::string(reinterpret_cast<const char *>(values.data()), values.size() * sizeof(float)));
    return boundary;
}

struct gate { // blocks engine steps until opened
    std::mutex m;
    std::condition_variable cv;
    bool open = false;
    std::atomic<int> waiting{0};
    void wait() {
        std::unique_lock<std::mutex> lock(m);
        waiting++;
        cv.wait(lock, [&] { return open; });
        waiting--;
    }
    void release() {
        { std::lock_guard<std::mutex> lock(m); open = true; }
        cv.notify_all();
    }
};

// The response to GET `path` (default /metrics) on a stage's metrics port.
inline std::string scrape(const stage & s, const std::string & path = "/metrics") {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port   = htons(static_cast<uint16_t>(s.server.metrics_port()));
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    CHECK(connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)) == 0);
    const std::string get = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(send(fd, get.data(), get.size(), 0) == static_cast<ssize_t>(get.size()));
    std::string body;
    char buffer[4096];
    for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) body.append(buffer, static_cast<size_t>(n));
    close(fd);
    return body;
}

// The value of the sample `series` (name and labels as written) in `body`; -1 when absent.
inline double sample(const std::string & body, const std::string & series) {
    const std::string line = "\n" + series + " ";
    const size_t at = body.find(line);
    return at == std::string::npos ? -1.0 : std::strtod(body.c_str() + at + line.size(), nullptr);
}

} // namespace meshnet_test
