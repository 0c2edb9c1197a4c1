// test-service-stream.cpp - ForwardStream: steps answered in order, failures and
// cancellation, and the decode loop that runs without the caller.
#include "fake_stages.h"

#include <thread>

using namespace meshnet;
using namespace meshnet_test;

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
