// test-service-batching.cpp - how the scheduler batches the steps of concurrent
// sessions into engine steps (fake stages over real gRPC on 127.0.0.1).
#include "fake_stages.h"

#include <thread>

using namespace meshnet;
using namespace meshnet_test;

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

TEST_MAIN()
