// test-service-metrics.cpp - what a stage's /metrics serves, scraped over HTTP.
#include "fake_stages.h"

#include <thread>

using namespace meshnet;
using namespace meshnet_test;

TEST("/metrics serves the request, latency, token, session, KV, boundary and engine-time metrics") {
    route r;
    r.last.engine.before_step = [] { std::this_thread::sleep_for(std::chrono::milliseconds(3)); };
    r.step("s", 0, {1, 2, 3});
    const std::string body = scrape(r.last);
    for (const char * name : {"HTTP/1.1 200 OK", "meshnet_shard_requests_total{rpc=\"Forward\",code=\"OK\"} 1",
                              "meshnet_shard_forward_latency_seconds_bucket", "meshnet_shard_tokens_processed_total 3",
                              "meshnet_shard_active_sessions 1", "meshnet_shard_kv_tokens_used 3",
                              "meshnet_shard_kv_tokens_capacity", "meshnet_shard_epoch 3",
                              "meshnet_shard_boundary_bytes_total{direction=\"in\"} 48"}) {
        if (body.find(name) == std::string::npos) std::printf("  missing: %s\n", name);
        CHECK(body.find(name) != std::string::npos);
    }
    CHECK(sample(body, "meshnet_shard_engine_busy_seconds_total") >= 0.003); // the step's sleep
    const double started = sample(body, "meshnet_shard_start_time_seconds");
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    CHECK(started > now - 600 && started <= now);
}

TEST("/metrics counts refused steps by their reason, apart from the gRPC code") {
    route r;
    pb::ForwardResponse response;
    pb::ForwardRequest other_epoch = tokens_request("s", 0, {1});
    other_epoch.mutable_key()->set_epoch(2);
    CHECK_EQ(reason(forward(r.first, other_epoch, response)), std::string("EPOCH_MISMATCH"));
    CHECK_EQ(reason(forward(r.first, tokens_request("t", 5, {1}), response)), std::string("CACHE_MISS"));
    CHECK_EQ(reason(forward(r.first, tokens_request("u", 9, {1}), response)), std::string("CACHE_MISS"));
    const std::string body = scrape(r.first);
    CHECK_EQ(sample(body, "meshnet_shard_errors_total{rpc=\"Forward\",reason=\"EPOCH_MISMATCH\"}"), 1.0);
    CHECK_EQ(sample(body, "meshnet_shard_errors_total{rpc=\"Forward\",reason=\"CACHE_MISS\"}"), 2.0);
    CHECK_EQ(sample(body, "meshnet_shard_requests_total{rpc=\"Forward\",code=\"FAILED_PRECONDITION\"}"), 3.0);
}

TEST("/health on the metrics port says what the gRPC health says: what kubelet probes of a TLS stage read") {
    route r;
    CHECK(scrape(r.first, "/health").rfind("HTTP/1.1 200 OK", 0) == 0);
    CHECK(scrape(r.first, "/health").find("SERVING") != std::string::npos);
    CHECK(scrape(r.first, "/nowhere").rfind("HTTP/1.1 404", 0) == 0);
}

TEST_MAIN()
