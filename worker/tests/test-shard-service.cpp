// test-shard-service.cpp - ShardService over real gRPC on 127.0.0.1 with fake engines:
// every bad input is answered with its documented reason while other sessions go on;
// slots, cancellation and ReleaseSession; GetInfo and the tokenizer.
#include "fake_stages.h"

#include <thread>

using namespace meshnet;
using namespace meshnet_test;

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

TEST_MAIN()
