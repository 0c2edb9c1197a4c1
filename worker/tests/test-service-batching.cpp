// test-service-batching.cpp - how the scheduler batches the steps of concurrent
// sessions into engine steps (fake stages over real gRPC on 127.0.0.1).
#include "fake_stages.h"

#include <thread>

using namespace meshnet;
using namespace meshnet_test;

// Five sessions queue behind one blocked step; returns the engine's batch sizes.
static std::vector<size_t> batches_behind_a_blocked_step(int32_t pipeline_depth, bool throughput = true) {
    worker_params params = small(8);
    params.pipeline_depth = pipeline_depth;
    params.throughput_batching = throughput; // two-token steps: batched only when rows may mix
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
    const auto sizes = batches_behind_a_blocked_step(1, worker_params{}.throughput_batching);  // exact
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

// One session's steps while the engine is held in the step of `running` (n_past 3, the
// session's prompt of 3 before it): each of `queued` is sent only once the one before it
// waits in the queue. Their answers, `running`'s first.
static std::vector<grpc::Status> behind_a_running_step(stage & s, const pb::ForwardRequest & running,
                                                       const std::vector<pb::ForwardRequest> & queued) {
    pb::ForwardResponse prompt;
    CHECK(forward(s, tokens_request("s", 0, {5, 6, 7}), prompt).ok());
    gate g;
    s.engine.before_step = [&] { g.wait(); };
    std::vector<grpc::Status> statuses(queued.size() + 1);
    std::vector<std::thread> clients;
    const auto send = [&](size_t i, const pb::ForwardRequest & request) {
        clients.emplace_back([&, i, request] { pb::ForwardResponse r; statuses[i] = forward(s, request, r); });
    };
    send(0, running);
    while (g.waiting.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (size_t i = 0; i < queued.size(); ++i) {
        send(i + 1, queued[i]);
        while (sample(scrape(s), "meshnet_shard_queue_depth") < static_cast<double>(i + 1)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    g.release();
    for (auto & c : clients) c.join();
    s.engine.before_step = nullptr;
    return statuses;
}

static pb::ForwardRequest discarding(int64_t n_past, const std::vector<int32_t> & tokens) {
    pb::ForwardRequest request = tokens_request("s", n_past, tokens);
    request.set_discard_from(n_past);
    return request;
}

TEST("a queued step whose positions a later queued step discards is answered STEP_SUPERSEDED, never run") {
    // A decode loop's windows dropped at a rejection: the step after the rejection
    // (discard_from 4) arrives while a window built on what it discards (n_past 5) waits.
    stage only(0, n_layer, small());
    const auto statuses = behind_a_running_step(
        only, tokens_request("s", 3, {1, 2}), {tokens_request("s", 5, {3}), discarding(4, {9})});
    CHECK(statuses[0].ok());
    CHECK_EQ(statuses[1].error_code(), grpc::StatusCode::ABORTED);
    CHECK_EQ(reason(statuses[1]), std::string("STEP_SUPERSEDED"));
    CHECK_EQ(metadata_of(statuses[1], "discard_from"), std::string("4"));
    CHECK(statuses[2].ok());
    CHECK(only.engine.batch_sizes() == (std::vector<size_t>{1, 1, 1})); // the prompt, 3:5 and 4:5
    CHECK_EQ(only.engine.slot_n_past(0), 5);
    CHECK_EQ(sample(scrape(only), "meshnet_shard_superseded_steps_total"), 1.0);
}

TEST("a step queued before the discard, or building below it, still runs") {
    // discard_from 5 leaves n_past 4's step (queued first) whole; a step queued after the
    // discard builds on it.
    stage only(0, n_layer, small());
    const auto statuses = behind_a_running_step(
        only, tokens_request("s", 3, {1}), {tokens_request("s", 4, {2, 3}), discarding(5, {9}),
                                            tokens_request("s", 6, {4})});
    for (const grpc::Status & status : statuses) CHECK(status.ok());
    CHECK_EQ(only.engine.slot_n_past(0), 7);
    CHECK_EQ(sample(scrape(only), "meshnet_shard_superseded_steps_total"), 0.0);
}

TEST("a non-last stage does not pass on a step that a discard queued while it ran supersedes") {
    // The stages after it would compute a void window; the last stage has nothing to save.
    stage first(0, 4, small());
    auto statuses = behind_a_running_step(first, tokens_request("s", 3, {1, 2}), {discarding(3, {9})});
    CHECK_EQ(reason(statuses[0]), std::string("STEP_SUPERSEDED"));
    CHECK(statuses[1].ok());
    CHECK_EQ(first.engine.slot_n_past(0), 4);
    CHECK_EQ(sample(scrape(first), "meshnet_shard_superseded_steps_total"), 1.0);
    stage last(4, n_layer, small());
    pb::ForwardRequest running = boundary_request("s", 3, valid_boundary(2));
    pb::ForwardRequest discard = boundary_request("s", 3, valid_boundary(1));
    discard.set_discard_from(3);
    pb::ForwardResponse prompt;
    CHECK(forward(last, boundary_request("s", 0, valid_boundary(3)), prompt).ok());
    gate g;
    last.engine.before_step = [&] { g.wait(); };
    grpc::Status ran, after;
    std::thread a([&] { pb::ForwardResponse r; ran = forward(last, running, r); });
    while (g.waiting.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::thread b([&] { pb::ForwardResponse r; after = forward(last, discard, r); });
    while (sample(scrape(last), "meshnet_shard_queue_depth") < 1.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    g.release();
    a.join();
    b.join();
    CHECK(ran.ok() && after.ok());
    CHECK_EQ(sample(scrape(last), "meshnet_shard_superseded_steps_total"), 0.0);
}

static pb::ForwardRequest verified(int64_t n_past, const std::vector<int32_t> & tokens) {
    pb::ForwardRequest request = tokens_request("s", n_past, tokens);
    request.mutable_output()->set_kind(pb::OUTPUT_KIND_VERIFIED);
    return request;
}

TEST("the last stage runs no window built on drafts it rejected, until the step after the rejection") {
    // A pipelined loop's window [1, d] at positions 3..4 whose draft d is wrong: the next
    // window (n_past 5, queued behind it) assumed d held. It is void before the step after
    // the rejection (discard_from 4) even arrives; that step, and later ones, run.
    const int32_t right = fake_engine::expected_token(1, 3, n_layer);
    const int32_t wrong = (right + 1) % fake_engine::fake_n_vocab;
    stage only(0, n_layer, small());
    const auto statuses = behind_a_running_step(only, verified(3, {1, wrong}), {tokens_request("s", 5, {9})});
    CHECK(statuses[0].ok());
    CHECK_EQ(reason(statuses[1]), std::string("STEP_SUPERSEDED"));
    CHECK_EQ(metadata_of(statuses[1], "discard_from"), std::string("5"));
    CHECK_EQ(only.engine.slot_n_past(0), 5); // the void window never ran
    pb::ForwardResponse r;
    CHECK(forward(only, discarding(4, {right}), r).ok());
    CHECK(forward(only, tokens_request("s", 5, {9}), r).ok());
    CHECK_EQ(only.engine.slot_n_past(0), 6);
    CHECK_EQ(sample(scrape(only), "meshnet_shard_superseded_steps_total"), 1.0);
}

TEST("a window whose drafts all held voids nothing after it") {
    const int32_t right = fake_engine::expected_token(1, 3, n_layer);
    stage only(0, n_layer, small());
    const auto statuses = behind_a_running_step(only, verified(3, {1, right}), {tokens_request("s", 5, {9})});
    for (const grpc::Status & status : statuses) CHECK(status.ok());
    CHECK_EQ(only.engine.slot_n_past(0), 6);
    CHECK_EQ(sample(scrape(only), "meshnet_shard_superseded_steps_total"), 0.0);
}

TEST("a whole-sequence copy no decode landed holds its slot out until one has") {
    // deepseek4's memory copies a sequence at the next decode: a snapshot queued by a step
    // the engine then refuses lands at whatever decode comes next, so its slot must not be
    // anyone's until then (else it overwrites the session computing there).
    worker_params params = small(2);
    params.prefix_block         = 4;
    params.prefix_cache_entries = 1;
    stage only(0, n_layer, params, 0, [](fake_engine & e) { e.set_copies_whole(); });
    pb::ForwardResponse r;
    CHECK(forward(only, tokens_request("a", 0, {1, 2, 3, 4}), r).ok()); // slot 0, on the grid
    pb::ForwardRequest snapshot = tokens_request("a", 4, {5});
    snapshot.set_prefix_snapshot(true); // copies a's 4 positions into slot 1 first
    only.engine.fail_next_step_of(0);
    gate g;
    only.engine.before_step = [&] { g.wait(); };
    grpc::Status failed, b, c;
    std::vector<std::thread> clients;
    clients.emplace_back([&] { pb::ForwardResponse x; failed = forward(only, snapshot, x); });
    while (g.waiting.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    clients.emplace_back([&] { pb::ForwardResponse x; b = forward(only, tokens_request("b", 0, {7}), x); });
    clients.emplace_back([&] { pb::ForwardResponse x; c = forward(only, tokens_request("c", 0, {8}), x); });
    while (sample(scrape(only), "meshnet_shard_queue_depth") < 2.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    g.release(); // a's step fails; then b and c in one step: slot 0 is free again, slot 1 is not
    for (auto & client : clients) client.join();
    only.engine.before_step = nullptr;
    CHECK(!failed.ok());
    CHECK(b.ok() != c.ok()); // one of them in slot 0 (whichever came first), not both
    const bool b_refused = !b.ok();
    CHECK_EQ(reason(b_refused ? b : c), std::string("CAPACITY_EXHAUSTED"));
    CHECK_EQ(only.engine.copies_onto_live(), 0);
    CHECK_EQ(only.engine.pending_copies(), size_t{0}); // that step landed it
    CHECK_EQ(sample(scrape(only), "meshnet_shard_prefix_cache_entries"), 0.0); // never a wrong one
    pb::ForwardResponse again; // slot 1 is free now
    CHECK(forward(only, tokens_request(b_refused ? "b" : "c", 0, {8}), again).ok());
    CHECK_EQ(only.engine.copies_onto_live(), 0);
}

TEST_MAIN()
