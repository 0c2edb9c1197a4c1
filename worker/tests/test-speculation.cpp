// test-speculation.cpp - the worker's part of speculative decoding over real gRPC on
// 127.0.0.1 with fake engines: OUTPUT_KIND_VERIFIED answers the accepted drafts and one
// more token, `discard_from` drops the rejected drafts' positions (down a chain too), and
// a stage that cannot discard refuses with DISCARD_UNSUPPORTED, one that cannot discard that
// deep with DISCARD_TOO_DEEP, leaving the session as it was.
#include "draft_verify.h"
#include "loop_drafts.h"
#include "error_info.h"
#include "fake_engine.h"
#include "service_test.h"
#include "worker_server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>

using namespace meshnet;
namespace pb = ::meshnet::shard::v1;

namespace {

constexpr int32_t n_layer = 8;

struct stage {
    fake_engine                             engine;
    worker_server                           server;
    std::unique_ptr<pb::ShardService::Stub> stub;

    stage(int32_t begin, int32_t end, bool can_discard = true, const std::string & next_stage = "",
          int32_t discard_depth = 0, int32_t exact_rows = max_exact_step_rows)
        : engine(n_layer, begin, end, 4, 64) {
        engine.set_can_discard(can_discard, discard_depth);
        worker_params params;
        params.n_slots        = 4;
        params.n_ctx          = 64;
        params.model_path     = "fake.gguf";
        params.route_id       = "test/route";
        params.epoch          = 3;
        params.listen         = "127.0.0.1:0";
        params.metrics_listen = "127.0.0.1:0";
        params.next_stage     = next_stage;
        std::string error;
        exactness exact; // the fake engine computes each row by itself (unless a test says less)
        exact.step_rows = exact_rows;
        exact.batching  = true;
        if (!server.start(params, engine, error, {}, {}, exact)) {
            std::printf("  cannot start stage: %s\n", error.c_str());
            std::abort();
        }
        stub = pb::ShardService::NewStub(grpc::CreateChannel(
            "127.0.0.1:" + std::to_string(server.port()), grpc::InsecureChannelCredentials()));
    }
    std::string endpoint() const { return "127.0.0.1:" + std::to_string(server.port()); }
};

pb::ForwardRequest step(int64_t n_past, const std::vector<int32_t> & tokens, bool verified = false) {
    pb::ForwardRequest request;
    request.mutable_key()->set_route_id("test/route");
    request.mutable_key()->set_epoch(3);
    request.mutable_key()->set_session_id("s");
    request.set_n_past(n_past);
    for (size_t i = 0; i < tokens.size(); ++i) {
        request.add_positions(static_cast<int32_t>(n_past + static_cast<int64_t>(i)));
        request.add_tokens(tokens[i]);
    }
    request.mutable_output()->set_kind(verified ? pb::OUTPUT_KIND_VERIFIED : pb::OUTPUT_KIND_SAMPLED);
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

int32_t next_of(int32_t token, int32_t position) {
    return fake_engine::expected_token(token, position, n_layer);
}

std::vector<int32_t> sampled(const pb::ForwardResponse & response) {
    return {response.sampled_tokens().begin(), response.sampled_tokens().end()};
}


// The tokens of a decode loop from `first` (stopping at `stop`, if given), and the drafts
// its steps carried.
struct loop_run {
    std::vector<int32_t> tokens;
    uint32_t             drafted = 0;
    grpc::Status         status;
};

loop_run decode_loop(stage & first, const std::string & session, uint32_t drafts, uint32_t count,
                     int32_t stop = -1, uint32_t windows = 0) {
    grpc::ClientContext context;
    auto stream = first.stub->ForwardStream(&context);
    pb::ForwardStreamRequest request;
    std::vector<int32_t> prompt(24); // tokens 0..23: most later tokens occur in it, so get drafts
    for (int32_t i = 0; i < 24; ++i) prompt[static_cast<size_t>(i)] = i;
    *request.mutable_forward() = step(0, prompt);
    request.mutable_forward()->mutable_key()->set_session_id(session);
    request.mutable_forward()->set_relay(true);
    request.mutable_forward()->set_continue_tokens(count - 1);
    request.mutable_forward()->set_loop_drafts(drafts);
    request.mutable_forward()->set_loop_windows(windows);
    if (stop >= 0) request.mutable_forward()->add_stop_token_ids(stop);
    stream->Write(request);
    stream->WritesDone();
    loop_run run;
    pb::ForwardStreamResponse response;
    while (stream->Read(&response)) {
        run.tokens.insert(run.tokens.end(), response.forward().sampled_tokens().begin(),
                          response.forward().sampled_tokens().end());
        run.drafted += response.forward().drafted_tokens();
    }
    run.status = stream->Finish();
    return run;
}

} // namespace

TEST("verify_drafts keeps the samples up to the first that is not the next draft") {
    constexpr int32_t n_vocab = 5;
    // rows predict 2, 3, 1, 4 (greedy)
    const std::vector<float> logits = {0, 0, 9, 0, 0,  0, 0, 0, 9, 0,  0, 9, 0, 0, 0,  0, 0, 0, 0, 9};
    const std::vector<int32_t> positions = {10, 11, 12, 13};
    const sampling_params greedy;
    CHECK_EQ(verify_drafts(logits.data(), n_vocab, greedy, positions, {7, 2, 3, 1}),
             (std::vector<int32_t>{2, 3, 1, 4}));  // every draft holds: all rows' samples
    CHECK_EQ(verify_drafts(logits.data(), n_vocab, greedy, positions, {7, 2, 0, 1}),
             (std::vector<int32_t>{2, 3}));        // the second draft fails: its correction
    CHECK_EQ(verify_drafts(logits.data(), n_vocab, greedy, positions, {7, 4, 3, 1}),
             (std::vector<int32_t>{2}));           // none holds: what plain decoding samples
    // Sampled: row by row exactly what SAMPLED draws at each position.
    const sampling_params warm{0.8f, 0, 0.0f, 42};
    std::vector<int32_t> plain;
    for (size_t i = 0; i < positions.size(); ++i) {
        plain.push_back(sample_token(logits.data() + i * n_vocab, n_vocab, warm, positions[i]));
    }
    const auto all = verify_drafts(logits.data(), n_vocab, warm, positions, {7, plain[0], plain[1], plain[2]});
    CHECK_EQ(all, plain);
}

TEST("a verified step answers the accepted drafts and one more token; discard_from drops the rest") {
    stage only(0, n_layer);
    pb::ForwardResponse response;
    CHECK(forward(only, step(0, {5, 6, 7}), response).ok());
    const int32_t t = response.sampled_tokens(0);           // after position 2
    const int32_t d1 = next_of(t, 3);                       // a right draft
    const int32_t d2 = (next_of(d1, 4) + 1) % fake_engine::fake_n_vocab; // a wrong one
    CHECK(forward(only, step(3, {t, d1, d2, 0}, true), response).ok());
    CHECK_EQ(sampled(response), (std::vector<int32_t>{d1, next_of(d1, 4)}));
    CHECK_EQ(response.n_past(), 7);                          // every row ran
    // Accepted: t and d1 (positions 3, 4). The next step drops positions 5 and 6.
    pb::ForwardRequest next = step(5, {next_of(d1, 4)});
    next.set_discard_from(5);
    CHECK(forward(only, next, response).ok());
    CHECK_EQ(response.n_past(), 6);
    CHECK_EQ(sampled(response), (std::vector<int32_t>{next_of(next_of(d1, 4), 5)}));
    CHECK_EQ(only.engine.slot_n_past(0), 6);
    // GetCapacity counts what this last stage verified: three drafts, one accepted.
    pb::GetCapacityResponse capacity;
    grpc::ClientContext context;
    CHECK(only.stub->GetCapacity(&context, pb::GetCapacityRequest{}, &capacity).ok());
    CHECK_EQ(capacity.draft_tokens_verified(), 3);
    CHECK_EQ(capacity.draft_tokens_accepted(), 1);
}

TEST("discard_from must equal n_past, and a stage holding less answers CACHE_MISS") {
    stage only(0, n_layer);
    pb::ForwardResponse response;
    CHECK(forward(only, step(0, {5, 6, 7, 8}), response).ok());
    pb::ForwardRequest bad = step(2, {1});
    bad.set_discard_from(3);
    const grpc::Status status = forward(only, bad, response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    CHECK_EQ(reason(status), std::string("INVALID_POSITIONS"));
    pb::ForwardRequest ahead = step(6, {1});
    ahead.set_discard_from(6);
    const grpc::Status miss = forward(only, ahead, response);
    CHECK_EQ(reason(miss), std::string("CACHE_MISS"));
    CHECK_EQ(only.engine.slot_n_past(0), 4);                 // untouched
}

TEST("a chained step carries discard_from to every stage and the last stage verifies") {
    stage last(4, n_layer);
    stage first(0, 4, true, last.endpoint());
    pb::ForwardResponse response;
    pb::ForwardRequest prefill = step(0, {5, 6, 7});
    prefill.set_relay(true);
    CHECK(forward(first, prefill, response).ok());
    const int32_t t = response.sampled_tokens(0);
    pb::ForwardRequest verify = step(3, {t, 0, 0}, true);    // two wrong drafts
    verify.set_relay(true);
    CHECK(forward(first, verify, response).ok());
    CHECK_EQ(sampled(response), (std::vector<int32_t>{next_of(t, 3)}));
    CHECK_EQ(first.engine.slot_n_past(0), 6);
    CHECK_EQ(last.engine.slot_n_past(0), 6);
    pb::ForwardRequest next = step(4, {next_of(t, 3)});
    next.set_relay(true);
    next.set_discard_from(4);
    CHECK(forward(first, next, response).ok());
    CHECK_EQ(first.engine.slot_n_past(0), 5);
    CHECK_EQ(last.engine.slot_n_past(0), 5);
    CHECK_EQ(sampled(response), (std::vector<int32_t>{next_of(next_of(t, 3), 4)}));
}

TEST("a stage that cannot discard says so in GetInfo and refuses with DISCARD_UNSUPPORTED") {
    stage only(0, n_layer, /*can_discard =*/ false);
    pb::GetInfoResponse info;
    {
        grpc::ClientContext context;
        CHECK(only.stub->GetInfo(&context, pb::GetInfoRequest{}, &info).ok());
    }
    CHECK(!info.can_discard());
    pb::ForwardResponse response;
    CHECK(forward(only, step(0, {5, 6, 7}), response).ok());
    pb::ForwardRequest next = step(2, {1});
    next.set_discard_from(2);
    const grpc::Status status = forward(only, next, response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    CHECK_EQ(reason(status), std::string("DISCARD_UNSUPPORTED"));
    CHECK_EQ(only.engine.slot_n_past(0), 3);
    stage able(0, n_layer);
    grpc::ClientContext context;
    CHECK(able.stub->GetInfo(&context, pb::GetInfoRequest{}, &info).ok());
    CHECK(info.can_discard());
}

TEST("a stage with snapshots says how deep in GetInfo and refuses a deeper discard with DISCARD_TOO_DEEP") {
    stage deep(0, n_layer, true, "", /*discard_depth =*/ 3);
    pb::GetInfoResponse info;
    {
        grpc::ClientContext context;
        CHECK(deep.stub->GetInfo(&context, pb::GetInfoRequest{}, &info).ok());
    }
    CHECK(info.can_discard() && info.discard_depth() == 3);
    pb::ForwardResponse response;
    CHECK(forward(deep, step(0, {5, 6, 7, 8, 9}), response).ok());
    pb::ForwardRequest next = step(1, {1});
    next.set_discard_from(1);
    const grpc::Status status = forward(deep, next, response);
    CHECK_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    std::string why;
    std::map<std::string, std::string> metadata;
    CHECK(error_info_decode(status, why, metadata));
    CHECK_EQ(why, std::string("DISCARD_TOO_DEEP"));
    CHECK_EQ(metadata["discard_depth"], std::string("3"));
    CHECK_EQ(metadata["positions"], std::string("4"));
    CHECK_EQ(deep.engine.slot_n_past(0), 5); // the session is as it was
    next = step(2, {1});
    next.set_discard_from(2);
    CHECK(forward(deep, next, response).ok());
    CHECK_EQ(deep.engine.slot_n_past(0), 3);
}

TEST("VERIFIED needs the step's tokens and no rows") {
    stage last(4, n_layer);
    stage first(0, 4, true, last.endpoint());
    pb::ForwardRequest request = step(0, {5, 6, 7}, true);
    request.set_relay(true);
    request.mutable_output()->add_rows(1);
    pb::ForwardResponse response;
    const grpc::Status status = forward(first, request, response);
    CHECK_EQ(reason(status), std::string("INVALID_OUTPUT_REQUEST"));
    CHECK_EQ(last.engine.slot_n_past(0), 0);
}

TEST("a speculative decode loop gives the plain loop's tokens, its stages dropping the rejected drafts") {
    stage last(4, n_layer);
    stage first(0, 4, true, last.endpoint());
    const loop_run plain = decode_loop(first, "plain", 0, 30);
    const loop_run drafted = decode_loop(first, "drafted", 4, 30);
    CHECK(plain.status.ok() && drafted.status.ok());
    CHECK_EQ(plain.tokens.size(), static_cast<size_t>(30));
    CHECK_EQ(drafted.tokens, plain.tokens);
    CHECK_EQ(plain.drafted, 0u);
    CHECK(drafted.drafted > 0); // (with these fake logits few drafts hold: most are discarded)
    // Both sessions hold the prompt and the tokens fed after it, nothing of a rejected draft.
    CHECK_EQ(last.engine.slot_n_past(1), first.engine.slot_n_past(1));
    CHECK_EQ(first.engine.slot_n_past(1), first.engine.slot_n_past(0));
}

TEST("a pipelined speculative loop gives the plain loop's tokens, one discard dropping every voided window") {
    stage last(4, n_layer);
    stage first(0, 4, true, last.endpoint());
    const loop_run plain = decode_loop(first, "plain", 0, 40);
    for (uint32_t windows : {2u, 4u, 8u}) {
        const std::string session = "windows-" + std::to_string(windows);
        const loop_run piped = decode_loop(first, session, 3, 40, -1, windows);
        CHECK(piped.status.ok());
        CHECK_EQ(piped.tokens, plain.tokens);
        CHECK(piped.drafted > 0);
    }
    // Every session holds the prompt and the tokens fed after it on both stages.
    for (int32_t slot = 1; slot <= 3; ++slot) {
        CHECK_EQ(last.engine.slot_n_past(slot), first.engine.slot_n_past(slot));
    }
}

TEST("a speculative decode loop stops at a stop token, even one inside an accepted run") {
    stage last(4, n_layer);
    stage first(0, 4, true, last.endpoint());
    const loop_run plain = decode_loop(first, "plain", 0, 30);
    for (size_t at : {size_t{3}, size_t{12}, size_t{25}}) {
        const int32_t stop = plain.tokens[at];
        const size_t  first_stop = static_cast<size_t>(
            std::find(plain.tokens.begin(), plain.tokens.end(), stop) - plain.tokens.begin());
        const loop_run drafted = decode_loop(first, "stop-" + std::to_string(at), 4, 30, stop);
        CHECK(drafted.status.ok());
        // Its answers end with the step that sampled the stop token (that step's answer
        // may hold accepted drafts after it, which the caller drops).
        const auto found = std::find(drafted.tokens.begin(), drafted.tokens.end(), stop);
        CHECK(found != drafted.tokens.end());
        CHECK_EQ(static_cast<size_t>(found - drafted.tokens.begin()), first_stop);
        CHECK(drafted.tokens.size() <= first_stop + 1 + max_loop_drafts);
        CHECK(std::equal(drafted.tokens.begin(), drafted.tokens.end(), plain.tokens.begin()));
    }
}

TEST("a decode loop drafts no wider than its stage measured exact: none where one row is") {
    stage last(4, n_layer);
    stage first(0, 4, true, last.endpoint(), 0, 1); // exact steps of one row only
    const loop_run plain = decode_loop(first, "plain", 0, 30);
    const loop_run asked = decode_loop(first, "asked", 4, 30);
    CHECK(asked.status.ok());
    CHECK_EQ(asked.tokens, plain.tokens);
    CHECK_EQ(asked.drafted, 0u); // no verify window through a step it computes inexactly
}

TEST("loop_drafts is for a first stage's decode loop, at most 7, and needs a stage that can discard") {
    stage only(0, n_layer);
    pb::ForwardResponse response;
    pb::ForwardRequest unary = step(0, {1, 2});
    unary.set_loop_drafts(4);
    CHECK_EQ(reason(forward(only, unary, response)), std::string("INVALID_OUTPUT_REQUEST"));
    CHECK_EQ(decode_loop(only, "wide", max_loop_drafts + 1, 8).status.error_code(),
             grpc::StatusCode::INVALID_ARGUMENT);
    stage stiff(0, n_layer, false);
    const loop_run refused = decode_loop(stiff, "stiff", 4, 8);
    CHECK_EQ(reason(refused.status), std::string("DISCARD_UNSUPPORTED"));
    CHECK(refused.tokens.empty());
}

TEST_MAIN()
