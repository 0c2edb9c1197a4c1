// test-service-relay.cpp - chained stages: steps relayed down the chain, failures
// answered with the downstream reason, relayed batches sharing engine steps, and a next
// stage that restarts or stays silent.
#include "fake_stages.h"
#include "relay_link.h"

#include <future>
#include <thread>

using namespace meshnet;
using namespace meshnet_test;

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
        p.throughput_batching = true; // its steps have two tokens: batched only when rows may mix
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

TEST_MAIN()
