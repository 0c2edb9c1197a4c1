// test-shard-service.cpp - ShardService over real gRPC on 127.0.0.1 with fake engines:
// every bad input is answered with its documented reason while other sessions go on;
// steps are batched; cancellation and ReleaseSession free slots.
#include "error_info.h"
#include "fake_engine.h"
#include "relay_link.h"
#include "service_test.h"
#include "worker_server.h"

#include <grpcpp/grpcpp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <thread>

using namespace meshnet;
namespace pb = ::meshnet::shard::v1;

namespace {

constexpr int32_t n_layer = 8;

// One fake stage served on an ephemeral loopback port.
struct stage {
    fake_engine                        engine;
    worker_server                      server;
    std::unique_ptr<pb::ShardService::Stub> stub;

    // `port` 0: an ephemeral one.
    stage(int32_t begin, int32_t end, worker_params params = {}, int port = 0)
        : engine(n_layer, begin, end, params.n_slots, params.n_ctx) {
        params.model_path     = "fake.gguf";
        params.route_id       = "test/route";
        params.epoch          = 3;
        params.listen         = "127.0.0.1:" + std::to_string(port);
        params.metrics_listen = "127.0.0.1:0";
        std::string error;
        if (!server.start(params, engine, error)) {
            std::printf("  cannot start stage: %s\n", error.c_str());
            std::abort();
        }
        stub = pb::ShardService::NewStub(grpc::CreateChannel(
            "127.0.0.1:" + std::to_string(server.port()), grpc::InsecureChannelCredentials()));
    }
};

worker_params small(int32_t slots = 4, int32_t ctx = 64, int64_t evict_idle_ms = 1000) {
    worker_params params;
    params.n_slots       = slots;
    params.n_ctx         = ctx;
    params.evict_idle_ms = evict_idle_ms;
    return params;
}

pb::ForwardRequest tokens_request(const std::string & session, int64_t n_past, const std::vector<int32_t> & tokens) {
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

pb::ForwardRequest boundary_request(const std::string & session, int64_t n_past, const pb::Boundary & boundary) {
    pb::ForwardRequest request = tokens_request(session, n_past, {});
    for (int64_t i = 0; i < boundary.shape(0); ++i) {
        request.add_positions(static_cast<int32_t>(n_past + i));
    }
    *request.mutable_boundary() = boundary;
    return request;
}

grpc::Status forward(stage & s, const pb::ForwardRequest & request, pb::ForwardResponse & response) {
    grpc::ClientContext context;
    return s.stub->Forward(&context, request, &response);
}

std::string reason(const grpc::Status & status) {
    std::string r;
    std::map<std::string, std::string> metadata;
    error_info_decode(status, r, metadata);
    return r;
}

std::string metadata_of(const grpc::Status & status, const std::string & key) {
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
void check_serves(stage & first, const std::string & session, int64_t n_past) {
    pb::ForwardResponse response;
    const grpc::Status status = forward(first, tokens_request(session, n_past, {5}), response);
    CHECK(status.ok());
    CHECK_EQ(response.n_past(), n_past + 1);
}

// Makes a valid boundary for `n` rows as the first stage would.
pb::Boundary valid_boundary(int64_t n) {
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

} // namespace

TEST("a two-stage route of fake stages decodes the tokens the fake model predicts") {
    route r;
    const std::vector<int32_t> prompt{3, 9, 4};
    int32_t token = r.step("s", 0, prompt);
    CHECK_EQ(token, fake_engine::expected_token(4, 2, n_layer));
    for (int64_t pos = 3; pos < 10; ++pos) {
        const int32_t next = r.step("s", pos, {token});
        CHECK_EQ(next, fake_engine::expected_token(token, static_cast<int32_t>(pos), n_layer));
        token = next;
    }
}

TEST("a request for another epoch is refused with EPOCH_MISMATCH and other sessions go on") {
    route r;
    r.step("good", 0, {1, 2});
    pb::ForwardRequest request = tokens_request("bad", 0, {1});
    request.mutable_key()->set_epoch(2);
    pb::ForwardResponse response;
    const grpc::Status status = forward(r.first, request, response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    CHECK_EQ(reason(status), std::string("EPOCH_MISMATCH"));
    CHECK_EQ(metadata_of(status, "stage_epoch"), std::string("3"));
    check_serves(r.first, "good", 2);
}

TEST("a request for another route is refused with ROUTE_MISMATCH") {
    route r;
    pb::ForwardRequest request = tokens_request("s", 0, {1});
    request.mutable_key()->set_route_id("other/route");
    pb::ForwardResponse response;
    CHECK_EQ(reason(forward(r.first, request, response)), std::string("ROUTE_MISMATCH"));
}

TEST("an unknown session with n_past above zero is a CACHE_MISS holding nothing") {
    route r;
    pb::ForwardResponse response;
    const grpc::Status status = forward(r.first, tokens_request("new", 4, {1}), response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    CHECK_EQ(reason(status), std::string("CACHE_MISS"));
    CHECK_EQ(metadata_of(status, "stage_n_past"), std::string("0"));
}

TEST("an n_past behind what the stage holds is a CACHE_MISS and clears the session") {
    route r;
    r.step("s", 0, {1, 2, 3});
    pb::ForwardResponse response;
    const grpc::Status behind = forward(r.first, tokens_request("s", 1, {7}), response);
    CHECK_EQ(reason(behind), std::string("CACHE_MISS"));
    CHECK_EQ(metadata_of(behind, "stage_n_past"), std::string("0"));
    CHECK(forward(r.first, tokens_request("s", 0, {1}), response).ok()); // re-prefill works
}

TEST("an n_past ahead of what the stage holds is a CACHE_MISS saying what it holds") {
    route r;
    r.step("s", 0, {1, 2, 3});
    pb::ForwardResponse response;
    const grpc::Status ahead = forward(r.first, tokens_request("s", 5, {7}), response);
    CHECK_EQ(reason(ahead), std::string("CACHE_MISS"));
    CHECK_EQ(metadata_of(ahead, "stage_n_past"), std::string("3"));
    check_serves(r.first, "s", 3);
}

TEST("boundaries of the wrong shape, dtype, schema, byte length or with NaN/Inf are refused") {
    route r;
    r.step("good", 0, {1});
    struct bad_case { const char * what; pb::Boundary boundary; const char * reason; };
    std::vector<bad_case> cases;
    pb::Boundary shape = valid_boundary(2);
    shape.set_shape(1, fake_engine::fake_n_embd + 1);
    cases.push_back({"shape", shape, "INVALID_BOUNDARY"});
    pb::Boundary dtype = valid_boundary(2);
    dtype.set_dtype(pb::BOUNDARY_DTYPE_F16);
    cases.push_back({"dtype", dtype, "BOUNDARY_SCHEMA_MISMATCH"});
    pb::Boundary schema = valid_boundary(2);
    schema.set_schema(pb::BOUNDARY_SCHEMA_MHC_RESIDUAL);
    cases.push_back({"schema", schema, "BOUNDARY_SCHEMA_MISMATCH"});
    pb::Boundary length = valid_boundary(2);
    length.mutable_data()->pop_back();
    cases.push_back({"length", length, "INVALID_BOUNDARY"});
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        pb::Boundary nonfinite = valid_boundary(2);
        std::memcpy(&(*nonfinite.mutable_data())[4], &bad, sizeof(float));
        cases.push_back({"non-finite", nonfinite, "INVALID_BOUNDARY"});
    }
    for (const auto & c : cases) {
        pb::ForwardResponse response;
        const grpc::Status status = forward(r.last, boundary_request("bad", 0, c.boundary), response);
        CHECK_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
        if (reason(status) != c.reason) std::printf("  case %s: %s\n", c.what, status.error_message().c_str());
        CHECK_EQ(reason(status), std::string(c.reason));
    }
    pb::ForwardResponse response;
    CHECK(forward(r.last, boundary_request("bad", 0, valid_boundary(2)), response).ok()); // nothing was kept
    CHECK_EQ(response.n_past(), 2);
}

TEST("positions that do not increase by one from n_past are refused") {
    route r;
    pb::ForwardRequest request = tokens_request("s", 0, {1, 2, 3});
    request.set_positions(2, 1);
    pb::ForwardResponse response;
    CHECK_EQ(reason(forward(r.first, request, response)), std::string("INVALID_POSITIONS"));
    request = tokens_request("s", 0, {1});
    request.set_positions(0, 4);
    CHECK_EQ(reason(forward(r.first, request, response)), std::string("INVALID_POSITIONS"));
}

TEST("token ids outside the vocabulary are refused") {
    route r;
    pb::ForwardResponse response;
    CHECK_EQ(reason(forward(r.first, tokens_request("s", 0, {1, fake_engine::fake_n_vocab}), response)),
             std::string("INVALID_TOKENS"));
    CHECK_EQ(reason(forward(r.first, tokens_request("s", 0, {-1}), response)), std::string("INVALID_TOKENS"));
    pb::DetokenizeRequest detok;
    detok.add_tokens(fake_engine::fake_n_vocab + 5);
    pb::DetokenizeResponse text;
    grpc::ClientContext context;
    CHECK_EQ(reason(r.first.stub->Detokenize(&context, detok, &text)), std::string("INVALID_TOKENS"));
}

TEST("a request over the message size limit is refused with MESSAGE_TOO_LARGE") {
    worker_params params = small();
    params.max_message_bytes = 4096;
    stage last(4, n_layer, params);
    pb::ForwardResponse response;
    const grpc::Status status = forward(last, boundary_request("s", 0, valid_boundary(300)), response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_EQ(reason(status), std::string("MESSAGE_TOO_LARGE"));
    CHECK(forward(last, boundary_request("s", 0, valid_boundary(2)), response).ok());
}

TEST("a prompt longer than the context is refused with CONTEXT_OVERFLOW") {
    stage first(0, 4, small(4, 16));
    pb::ForwardResponse response;
    const grpc::Status status = forward(first, tokens_request("s", 0, std::vector<int32_t>(17, 1)), response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
    CHECK_EQ(reason(status), std::string("CONTEXT_OVERFLOW"));
    CHECK(forward(first, tokens_request("s", 0, std::vector<int32_t>(16, 1)), response).ok());
    CHECK_EQ(reason(forward(first, tokens_request("s", 16, {1}), response)), std::string("CONTEXT_OVERFLOW"));
}

TEST("a step larger than the batch limit is refused with STEP_TOO_LARGE") {
    worker_params params = small();
    params.n_batch = 8;
    stage first(0, 4, params);
    pb::ForwardResponse response;
    CHECK_EQ(reason(forward(first, tokens_request("s", 0, std::vector<int32_t>(9, 1)), response)),
             std::string("STEP_TOO_LARGE"));
}

TEST("more sessions than slots are refused while the others are recently used") {
    stage first(0, 4, small(2, 64, 60000));
    pb::ForwardResponse response;
    CHECK(forward(first, tokens_request("a", 0, {1}), response).ok());
    CHECK(forward(first, tokens_request("b", 0, {1}), response).ok());
    const grpc::Status status = forward(first, tokens_request("c", 0, {1}), response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK_EQ(reason(status), std::string("CAPACITY_EXHAUSTED"));
    check_serves(first, "a", 1);
    check_serves(first, "b", 1);
}

TEST("more sessions than slots evict the least recently used idle session") {
    stage first(0, 4, small(2, 64, 0));
    pb::ForwardResponse response;
    CHECK(forward(first, tokens_request("a", 0, {1}), response).ok());
    CHECK(forward(first, tokens_request("b", 0, {1}), response).ok());
    CHECK(forward(first, tokens_request("a", 1, {1}), response).ok()); // b is now LRU
    CHECK(forward(first, tokens_request("c", 0, {1}), response).ok());
    CHECK_EQ(reason(forward(first, tokens_request("b", 1, {1}), response)), std::string("CACHE_MISS"));
    check_serves(first, "a", 2);
}

TEST("logits requested from a non-last stage are refused with INVALID_OUTPUT_REQUEST") {
    route r;
    for (auto kind : {pb::OUTPUT_KIND_LOGITS, pb::OUTPUT_KIND_TOP_K, pb::OUTPUT_KIND_SAMPLED}) {
        pb::ForwardRequest request = tokens_request("s", 0, {1});
        request.mutable_output()->set_kind(kind);
        pb::ForwardResponse response;
        CHECK_EQ(reason(forward(r.first, request, response)), std::string("INVALID_OUTPUT_REQUEST"));
    }
}

TEST("a request expecting another layer range is refused with RANGE_MISMATCH") {
    route r;
    pb::ForwardRequest request = tokens_request("s", 0, {1});
    request.mutable_expected_range()->set_begin(0);
    request.mutable_expected_range()->set_end(5);
    pb::ForwardResponse response;
    const grpc::Status status = forward(r.first, request, response);
    CHECK_EQ(reason(status), std::string("RANGE_MISMATCH"));
    CHECK_EQ(metadata_of(status, "stage_range"), std::string("0:4"));
    request.mutable_expected_range()->set_end(4);
    CHECK(forward(r.first, request, response).ok());
}

TEST("the last stage answers logits, top-k and samples for the requested rows") {
    route r;
    pb::ForwardResponse mid;
    CHECK(forward(r.first, tokens_request("s", 0, {3, 9, 4}), mid).ok());
    pb::ForwardRequest request = boundary_request("s", 0, mid.boundary());
    request.mutable_output()->set_kind(pb::OUTPUT_KIND_TOP_K);
    request.mutable_output()->set_top_k(3);
    request.mutable_output()->add_rows(0);
    request.mutable_output()->add_rows(2);
    pb::ForwardResponse out;
    CHECK(forward(r.last, request, out).ok());
    CHECK_EQ(out.rows_size(), 2);
    CHECK_EQ(out.rows(0).token_ids(0), fake_engine::expected_token(3, 0, n_layer));
    CHECK_EQ(out.rows(1).token_ids(0), fake_engine::expected_token(4, 2, n_layer));
    CHECK_EQ(out.rows(1).logits_size(), 3);
}

// Five sessions queue behind one blocked step; returns the engine's batch sizes.
static std::vector<size_t> batches_behind_a_blocked_step(int32_t pipeline_depth, int32_t exact_rows = 0) {
    worker_params params = small(8);
    params.pipeline_depth = pipeline_depth;
    params.exact_batch_rows = exact_rows; // two-token steps: batched only when rows may mix
    stage first(0, 4, params);
    gate g;
    std::atomic<bool> first_step{true};
    first.engine.before_step = [&] { if (first_step.exchange(false)) g.wait(); };
    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    clients.emplace_back([&] { pb::ForwardResponse r; ok += forward(first, tokens_request("s0", 0, {1}), r).ok(); });
    while (g.waiting.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 1; i < 6; ++i) {
        clients.emplace_back([&, i] {
            pb::ForwardResponse r;
            ok += forward(first, tokens_request("s" + std::to_string(i), 0, {1, 2}), r).ok();
        });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200)); // all five queue behind the blocked step
    g.release();
    for (auto & c : clients) c.join();
    CHECK_EQ(ok.load(), 6);
    return first.engine.batch_sizes();
}

TEST("concurrent sessions' steps are batched into one engine step") {
    const auto sizes = batches_behind_a_blocked_step(1);
    CHECK_EQ(sizes.size(), static_cast<size_t>(2));
    if (sizes.size() == 2) CHECK_EQ(sizes[1], static_cast<size_t>(5));
}

TEST("by default a prefill step runs alone: no session's rows depend on another's") {
    const auto sizes = batches_behind_a_blocked_step(1, worker_params{}.exact_batch_rows);  // auto: CPU
    CHECK(sizes == (std::vector<size_t>{1, 1, 1, 1, 1, 1}));
}

TEST("in a route of two stages the generating sessions run as two groups") {
    // Six sessions generate: groups of three, so that one group computes here while
    // the other computes at the other stage. The derived depth (8 layers / 4) is 2 too.
    for (int32_t depth : {2, 0}) {
        const auto sizes = batches_behind_a_blocked_step(depth);
        CHECK_EQ(sizes.size(), static_cast<size_t>(3));
        if (sizes.size() == 3) {
            CHECK_EQ(sizes[1], static_cast<size_t>(3));
            CHECK_EQ(sizes[2], static_cast<size_t>(2));
        }
    }
}

TEST("with --batch-wait-us a step does not wait for active sessions whose steps stay away") {
    worker_params params = small(4);
    params.batch_wait_us = 2'000'000; // far longer than the test may take
    stage first(0, 4, params);
    pb::ForwardResponse r;
    // Each step comes alone while the other sessions (all used within the last 100 ms)
    // are elsewhere in the pipeline: it ends its burst and runs after the burst gap
    // (0.3 ms), never after the 2 s wait.
    const auto started = std::chrono::steady_clock::now();
    for (const char * session : {"s0", "s1", "s2"}) {
        CHECK(forward(first, tokens_request(session, 0, {1}), r).ok());
    }
    for (const char * session : {"s0", "s1", "s2"}) {
        CHECK(forward(first, tokens_request(session, 1, {2}), r).ok());
    }
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::milliseconds(1000));
}

TEST("a cancelled call frees its session's slot") {
    stage first(0, 4, small(2));
    gate g;
    first.engine.before_step = [&] { g.wait(); };
    grpc::ClientContext context;
    pb::ForwardResponse response;
    std::thread client([&] { first.stub->Forward(&context, tokens_request("s", 0, {1, 2}), &response); });
    while (g.waiting.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    context.TryCancel();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    g.release();
    client.join();
    first.engine.before_step = nullptr;
    pb::GetCapacityResponse capacity;
    for (int i = 0; i < 100; ++i) { // the release runs on the engine thread
        grpc::ClientContext c;
        first.stub->GetCapacity(&c, pb::GetCapacityRequest{}, &capacity);
        if (capacity.slots_free() == 2) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK_EQ(capacity.slots_free(), 2);
    CHECK_EQ(reason(forward(first, tokens_request("s", 2, {1}), response)), std::string("CACHE_MISS"));
}

TEST("ReleaseSession frees the slot and is idempotent") {
    stage first(0, 4, small(2));
    pb::ForwardResponse response;
    CHECK(forward(first, tokens_request("s", 0, {1, 2}), response).ok());
    pb::ReleaseSessionRequest release;
    release.mutable_key()->set_route_id("test/route");
    release.mutable_key()->set_epoch(3);
    release.mutable_key()->set_session_id("s");
    pb::ReleaseSessionResponse released;
    { grpc::ClientContext c; CHECK(first.stub->ReleaseSession(&c, release, &released).ok()); }
    CHECK(released.released());
    { grpc::ClientContext c; CHECK(first.stub->ReleaseSession(&c, release, &released).ok()); }
    CHECK(!released.released());
    pb::GetCapacityResponse capacity;
    { grpc::ClientContext c; first.stub->GetCapacity(&c, pb::GetCapacityRequest{}, &capacity); }
    CHECK_EQ(capacity.slots_free(), 2);
    CHECK_EQ(capacity.kv_tokens_free(), capacity.kv_tokens_total());
}

TEST("an engine failure in one session leaves the other sessions intact") {
    stage first(0, 4, small(4));
    pb::ForwardResponse response;
    CHECK(forward(first, tokens_request("a", 0, {1, 2}), response).ok());
    CHECK(forward(first, tokens_request("b", 0, {1, 2, 3}), response).ok());
    first.engine.fail_next_step_of(0); // a's slot
    const grpc::Status status = forward(first, tokens_request("a", 2, {1}), response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
    CHECK_EQ(reason(status), std::string("ENGINE_FAILURE"));
    check_serves(first, "b", 3);
    CHECK_EQ(reason(forward(first, tokens_request("a", 2, {1}), response)), std::string("CACHE_MISS"));
}

TEST("GetInfo reports identities, range, boundary and limits") {
    stage last(4, n_layer, small());
    pb::GetInfoResponse info;
    grpc::ClientContext context;
    CHECK(last.stub->GetInfo(&context, pb::GetInfoRequest{}, &info).ok());
    CHECK_EQ(info.protocol(), std::string("meshnet.shard.v1"));
    CHECK_EQ(info.route_id(), std::string("test/route"));
    CHECK_EQ(info.epoch(), static_cast<uint64_t>(3));
    CHECK_EQ(info.layers().begin(), 4);
    CHECK_EQ(info.layers().end(), n_layer);
    CHECK_EQ(info.n_layer(), n_layer);
    CHECK_EQ(info.boundary().schema(), pb::BOUNDARY_SCHEMA_DENSE_RESIDUAL);
    CHECK_EQ(info.boundary().row_shape_size(), 1);
    CHECK_EQ(info.incarnation().size(), static_cast<size_t>(32));
    CHECK_EQ(info.max_step_tokens(), 512);
}

TEST("Tokenize and Detokenize use the stage's vocabulary") {
    stage first(0, 4, small());
    pb::TokenizeRequest request;
    request.set_text("ab");
    request.set_add_special(true);
    pb::TokenizeResponse tokens;
    { grpc::ClientContext c; CHECK(first.stub->Tokenize(&c, request, &tokens).ok()); }
    CHECK_EQ(tokens.tokens_size(), 3);
    pb::DetokenizeRequest detok;
    detok.add_tokens(0);
    detok.add_tokens(2);
    pb::DetokenizeResponse text;
    { grpc::ClientContext c; CHECK(first.stub->Detokenize(&c, detok, &text).ok()); }
    CHECK_EQ(text.text(), std::string("ac"));
}

TEST("the stream answers steps in order and its cancellation releases the session") {
    stage first(0, 4, small(2));
    grpc::ClientContext context;
    auto stream = first.stub->ForwardStream(&context);
    for (int64_t pos = 0; pos < 3; ++pos) {
        pb::ForwardStreamRequest request;
        *request.mutable_forward() = tokens_request("s", pos, {1});
        CHECK(stream->Write(request));
        pb::ForwardStreamResponse response;
        CHECK(stream->Read(&response));
        CHECK_EQ(response.forward().n_past(), pos + 1);
    }
    context.TryCancel();
    stream->Finish();
    pb::GetCapacityResponse capacity;
    for (int i = 0; i < 100; ++i) {
        grpc::ClientContext c;
        first.stub->GetCapacity(&c, pb::GetCapacityRequest{}, &capacity);
        if (capacity.slots_free() == 2) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK_EQ(capacity.slots_free(), 2);
}

TEST("a failing step ends the stream with its reason") {
    stage first(0, 4, small(2));
    grpc::ClientContext context;
    auto stream = first.stub->ForwardStream(&context);
    pb::ForwardStreamRequest request;
    *request.mutable_forward() = tokens_request("s", 7, {1});
    CHECK(stream->Write(request));
    pb::ForwardStreamResponse response;
    CHECK(!stream->Read(&response));
    const grpc::Status status = stream->Finish();
    CHECK_EQ(reason(status), std::string("CACHE_MISS"));
}

// The body of GET /metrics on a stage's metrics port.
static std::string scrape(const stage & s) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port   = htons(static_cast<uint16_t>(s.server.metrics_port()));
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    CHECK(connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)) == 0);
    const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(send(fd, get.data(), get.size(), 0) == static_cast<ssize_t>(get.size()));
    std::string body;
    char buffer[4096];
    for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) body.append(buffer, static_cast<size_t>(n));
    close(fd);
    return body;
}

// The value of the sample `series` (name and labels as written) in `body`; -1 when absent.
static double sample(const std::string & body, const std::string & series) {
    const std::string line = "\n" + series + " ";
    const size_t at = body.find(line);
    return at == std::string::npos ? -1.0 : std::strtod(body.c_str() + at + line.size(), nullptr);
}

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

TEST("a chained step is relayed down the chain and answered with the last stage's token") {
    stage last(4, n_layer, small());
    worker_params params = small();
    params.next_stage = "127.0.0.1:" + std::to_string(last.server.port());
    stage first(0, 4, params);
    pb::ForwardRequest request = tokens_request("s", 0, {3, 9, 4});
    request.set_relay(true);
    request.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    pb::ForwardResponse response;
    CHECK(forward(first, request, response).ok());
    CHECK_EQ(response.sampled_tokens_size(), 1);
    CHECK_EQ(response.sampled_tokens(0), fake_engine::expected_token(4, 2, n_layer));
    CHECK_EQ(response.chain_size(), 2);
    CHECK_EQ(response.chain(0).layers().end(), 4);
    CHECK_EQ(response.chain(1).layers().begin(), 4);
    CHECK_EQ(response.n_past(), 3);
    pb::GetInfoResponse info;
    grpc::ClientContext context;
    CHECK(first.stub->GetInfo(&context, pb::GetInfoRequest{}, &info).ok());
    CHECK_EQ(info.next_stage(), params.next_stage);
    // Only the stage that relays measures the seam behind it: one step, one hop.
    CHECK_EQ(sample(scrape(first), "meshnet_shard_next_hop_seconds_count"), 1.0);
    CHECK_EQ(sample(scrape(last), "meshnet_shard_next_hop_seconds_count"), 0.0);
}

TEST("a failure down the chain is answered with the downstream stage's reason") {
    stage last(4, n_layer, small());
    worker_params params = small();
    params.next_stage = "127.0.0.1:" + std::to_string(last.server.port());
    stage first(0, 4, params);
    pb::ForwardRequest request = tokens_request("s", 0, {1, 2, 3});
    request.set_relay(true);
    pb::ForwardResponse response;
    CHECK(forward(first, request, response).ok());
    CHECK(forward(first, tokens_request("s", 3, {4}), response).ok()); // the first stage runs ahead
    request = tokens_request("s", 4, {5});
    request.set_relay(true);
    const grpc::Status status = forward(first, request, response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    CHECK_EQ(reason(status), std::string("CACHE_MISS"));
    CHECK_EQ(metadata_of(status, "stage_n_past"), std::string("3"));
}

TEST("relay asked of a stage without a next stage is refused with RELAY_UNAVAILABLE") {
    route r;
    pb::ForwardRequest request = tokens_request("s", 0, {1});
    request.set_relay(true);
    pb::ForwardResponse response;
    const grpc::Status status = forward(r.first, request, response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    CHECK_EQ(reason(status), std::string("RELAY_UNAVAILABLE"));
    pb::ForwardResponse mid;
    CHECK(forward(r.first, tokens_request("s", 0, {1}), mid).ok()); // nothing was kept
    pb::ForwardRequest last_request = boundary_request("s", 0, mid.boundary());
    last_request.set_relay(true); // the last stage has no one to relay to: it answers
    CHECK(forward(r.last, last_request, response).ok());
}

// A first stage 0:4 relaying to a last stage 4:8, both taking any number of sessions
// into one engine step (pipeline depth 1); the first stage's first step blocks on `g`.
struct blocked_chain {
    gate               g;
    std::atomic<bool>  first_step{true};
    stage              last{4, n_layer, params()};
    stage              first{0, 4, params(last.server.port())};

    static worker_params params(int next_port = 0) {
        worker_params p = small(8);
        p.pipeline_depth = 1;
        p.exact_batch_rows = 0; // its steps have two tokens: batched only when rows may mix
        if (next_port) p.next_stage = "127.0.0.1:" + std::to_string(next_port);
        return p;
    }
    blocked_chain() {
        first.engine.before_step = [this] { if (first_step.exchange(false)) g.wait(); };
    }
    // A step of another session (answered by the first stage itself) that blocks it.
    std::thread block() {
        std::thread blocker([this] { pb::ForwardResponse r; CHECK(forward(first, tokens_request("blocker", 0, {1}), r).ok()); });
        while (g.waiting.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return blocker;
    }
};

pb::ForwardRequest relayed_request(const std::string & session, int64_t n_past, const std::vector<int32_t> & tokens) {
    pb::ForwardRequest request = tokens_request(session, n_past, tokens);
    request.set_relay(true);
    request.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    return request;
}

TEST("the relayed steps of one engine step reach the next stage together and share its engine step") {
    blocked_chain chain;
    std::thread blocker = chain.block();
    std::vector<std::thread> clients;
    std::atomic<int> right{0};
    for (int i = 0; i < 4; ++i) {
        clients.emplace_back([&, i] {
            pb::ForwardResponse r;
            const bool ok = forward(chain.first, relayed_request("s" + std::to_string(i), 0, {i, 7}), r).ok();
            right += ok && r.sampled_tokens_size() == 1 &&
                     r.sampled_tokens(0) == fake_engine::expected_token(7, 1, n_layer) && r.chain_size() == 2;
        });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200)); // all four queue behind the blocker
    chain.g.release();
    blocker.join();
    for (auto & c : clients) c.join();
    CHECK_EQ(right.load(), 4);
    CHECK(chain.first.engine.batch_sizes() == (std::vector<size_t>{1, 4}));
    CHECK(chain.last.engine.batch_sizes() == (std::vector<size_t>{4}));
}

TEST("the answers of one relayed batch feed their decode loops as one engine step") {
    blocked_chain chain;
    std::thread blocker = chain.block();
    std::vector<std::thread> loops;
    std::atomic<int> answers{0};
    for (int i = 0; i < 4; ++i) {
        loops.emplace_back([&, i] {
            grpc::ClientContext context;
            auto stream = chain.first.stub->ForwardStream(&context);
            pb::ForwardStreamRequest request;
            *request.mutable_forward() = relayed_request("loop" + std::to_string(i), 0, {i});
            request.mutable_forward()->set_continue_tokens(3);
            CHECK(stream->Write(request));
            stream->WritesDone();
            pb::ForwardStreamResponse response;
            while (stream->Read(&response)) ++answers;
            CHECK(stream->Finish().ok());
        });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    chain.g.release();
    blocker.join();
    for (auto & l : loops) l.join();
    CHECK_EQ(answers.load(), 16);
    // Without the hold the first answer's next step could start alone (1, then 3).
    CHECK(chain.first.engine.batch_sizes() == (std::vector<size_t>{1, 4, 4, 4, 4}));
    CHECK(chain.last.engine.batch_sizes() == (std::vector<size_t>{4, 4, 4, 4}));
}

TEST("a bad step in a relayed batch gets its own reason and the others run") {
    stage last(4, n_layer, small());
    grpc::ClientContext context;
    auto stream = last.stub->Relay(&context);
    pb::RelayRequest request;
    request.set_batch_id(41);
    pb::ForwardRequest good = boundary_request("good", 0, valid_boundary(2));
    good.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    pb::ForwardRequest stale = good;
    stale.mutable_key()->set_session_id("stale");
    stale.mutable_key()->set_epoch(2);
    *request.add_steps() = good;
    *request.add_steps() = stale;
    CHECK(stream->Write(request));
    pb::RelayResponse response;
    CHECK(stream->Read(&response));
    CHECK_EQ(response.batch_id(), uint64_t{41});
    CHECK_EQ(response.results_size(), 2);
    if (response.results_size() == 2) {
        CHECK_EQ(response.results(0).code(), 0);
        CHECK_EQ(response.results(0).forward().sampled_tokens_size(), 1);
        CHECK_EQ(response.results(0).forward().n_past(), 2);
        const pb::RelayResult & refused = response.results(1);
        const grpc::Status status(static_cast<grpc::StatusCode>(refused.code()), refused.message(), refused.details());
        CHECK_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
        CHECK_EQ(reason(status), std::string("EPOCH_MISMATCH"));
    }
    stream->WritesDone();
    CHECK(stream->Finish().ok());
}

TEST("a session twice in one relayed batch: the later step is refused, the session kept") {
    stage last(4, n_layer, small());
    grpc::ClientContext context;
    auto stream = last.stub->Relay(&context);
    pb::RelayRequest request;
    request.set_batch_id(5);
    pb::ForwardRequest step = boundary_request("twice", 0, valid_boundary(2));
    step.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    *request.add_steps() = step;
    *request.add_steps() = step;
    CHECK(stream->Write(request));
    pb::RelayResponse response;
    CHECK(stream->Read(&response));
    CHECK_EQ(response.results_size(), 2);
    if (response.results_size() == 2) {
        CHECK_EQ(response.results(0).code(), 0);
        CHECK_EQ(response.results(0).forward().n_past(), 2);
        const pb::RelayResult & refused = response.results(1);
        const grpc::Status status(static_cast<grpc::StatusCode>(refused.code()), refused.message(), refused.details());
        CHECK_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
        CHECK_EQ(reason(status), std::string("DUPLICATE_SESSION"));
    }
    stream->WritesDone();
    CHECK(stream->Finish().ok());
    // The session goes on from where its one step left it.
    pb::ForwardRequest next = boundary_request("twice", 2, valid_boundary(1));
    next.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    pb::ForwardResponse answer;
    CHECK(forward(last, next, answer).ok());
    CHECK_EQ(answer.n_past(), 3);
}

TEST("a chain stage waits out a next stage that restarts and relays to the new one") {
    auto last = std::make_unique<stage>(4, n_layer, small());
    const int port = last->server.port();
    worker_params params = small();
    params.next_stage = "127.0.0.1:" + std::to_string(port);
    stage first(0, 4, params);
    pb::ForwardResponse response;
    CHECK(forward(first, relayed_request("before", 0, {3}), response).ok());
    last.reset(); // the next stage goes away; its replacement comes up on the same port
    std::thread restart([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        last = std::make_unique<stage>(4, n_layer, small(), port);
    });
    const grpc::Status status = forward(first, relayed_request("after", 0, {3}), response);
    restart.join();
    CHECK(status.ok());
    CHECK_EQ(response.sampled_tokens_size(), 1);
    CHECK_EQ(response.chain_size(), 2);
    if (response.chain_size() == 2) CHECK_EQ(response.chain(1).incarnation(), last->server.incarnation());
}

TEST("a relayed batch the next stage leaves unanswered past the link's deadline fails with DEADLINE_EXCEEDED") {
    stage last(4, n_layer, small());
    gate g;
    last.engine.before_step = [&] { g.wait(); };
    relay_link link(grpc::CreateChannel("127.0.0.1:" + std::to_string(last.server.port()),
                                        grpc::InsecureChannelCredentials()),
                    std::chrono::milliseconds(200));
    pb::ForwardRequest step = boundary_request("late", 0, valid_boundary(1));
    step.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    std::promise<std::vector<relay_answer>> answered;
    const auto sent = std::chrono::steady_clock::now();
    link.send({step}, [&](std::vector<relay_answer> & answers) { answered.set_value(answers); });
    auto answers = answered.get_future();
    CHECK(answers.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
    g.release();
    const auto got = answers.get();
    CHECK(std::chrono::steady_clock::now() - sent >= std::chrono::milliseconds(200));
    CHECK_EQ(got.size(), static_cast<size_t>(1));
    if (got.size() == 1) CHECK_EQ(got[0].status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST("a stream decode loop answers every continued token without the caller") {
    stage last(4, n_layer, small());
    worker_params params = small();
    params.next_stage = "127.0.0.1:" + std::to_string(last.server.port());
    stage first(0, 4, params);
    grpc::ClientContext context;
    auto stream = first.stub->ForwardStream(&context);
    pb::ForwardStreamRequest request;
    *request.mutable_forward() = tokens_request("s", 0, {3, 9, 4});
    request.mutable_forward()->set_relay(true);
    request.mutable_forward()->set_continue_tokens(5);
    request.mutable_forward()->mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    CHECK(stream->Write(request));
    stream->WritesDone(); // the loop still answers everything before the stream ends
    int32_t token = 4, position = 2;
    int answers = 0;
    pb::ForwardStreamResponse response;
    while (stream->Read(&response)) {
        const int32_t expected = fake_engine::expected_token(token, position, n_layer);
        CHECK_EQ(response.forward().sampled_tokens(0), expected);
        CHECK_EQ(response.forward().n_past(), position + 1);
        token = expected;
        ++position;
        ++answers;
    }
    CHECK(stream->Finish().ok());
    CHECK_EQ(answers, 6);
}

TEST("a decode loop sends its first answer at once and holds the others for --stream-flush-ms") {
    // Steps take 40 ms. Sending each answer at once, the second comes a step after the
    // first; holding them for 60 s, the second comes with the last, which goes at once.
    for (int64_t flush_ms : {int64_t{0}, int64_t{60000}}) {
        worker_params params = small();
        params.stream_flush_ms = flush_ms;
        stage single(0, n_layer, params);
        single.engine.before_step = [] { std::this_thread::sleep_for(std::chrono::milliseconds(40)); };
        grpc::ClientContext context;
        auto stream = single.stub->ForwardStream(&context);
        pb::ForwardStreamRequest request;
        *request.mutable_forward() = tokens_request("s", 0, {4});
        request.mutable_forward()->set_continue_tokens(5);
        request.mutable_forward()->mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
        CHECK(stream->Write(request));
        stream->WritesDone();
        std::vector<std::chrono::steady_clock::time_point> arrivals;
        pb::ForwardStreamResponse response;
        while (stream->Read(&response)) arrivals.push_back(std::chrono::steady_clock::now());
        CHECK(stream->Finish().ok());
        CHECK_EQ(arrivals.size(), static_cast<size_t>(6));
        if (arrivals.size() != 6) continue;
        const auto second_after_first = arrivals[1] - arrivals[0];
        const auto last_after_second  = arrivals[5] - arrivals[1];
        if (flush_ms == 0) {
            CHECK(last_after_second > std::chrono::milliseconds(100)); // four more steps
        } else {
            CHECK(second_after_first > std::chrono::milliseconds(100)); // held to the end
            CHECK(last_after_second < std::chrono::milliseconds(30));
        }
    }
}

TEST("a stream decode loop stops at a stop token and refuses to run on Forward") {
    stage single(0, n_layer, small());
    const int32_t first_token = fake_engine::expected_token(4, 0, n_layer);
    const int32_t second_token = fake_engine::expected_token(first_token, 1, n_layer);
    grpc::ClientContext context;
    auto stream = single.stub->ForwardStream(&context);
    pb::ForwardStreamRequest request;
    *request.mutable_forward() = tokens_request("s", 0, {4});
    request.mutable_forward()->set_continue_tokens(50);
    request.mutable_forward()->add_stop_token_ids(second_token);
    request.mutable_forward()->mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    CHECK(stream->Write(request));
    stream->WritesDone();
    std::vector<int32_t> tokens;
    pb::ForwardStreamResponse response;
    while (stream->Read(&response)) tokens.push_back(response.forward().sampled_tokens(0));
    CHECK(stream->Finish().ok());
    CHECK(tokens == (std::vector<int32_t>{first_token, second_token}));

    pb::ForwardRequest unary = tokens_request("u", 0, {4});
    unary.set_continue_tokens(3);
    unary.mutable_output()->set_kind(pb::OUTPUT_KIND_SAMPLED);
    pb::ForwardResponse answer;
    CHECK_EQ(reason(forward(single, unary, answer)), std::string("INVALID_OUTPUT_REQUEST"));
}

TEST_MAIN()
