// test-loop-windows.cpp - a ForwardStream's decode loops on the stream's side (loop_windows):
// the limits a loop runs under, the steps its windows are sent as, and the order the
// stream's answers are written in, without a transport.
#include "loop_windows.h"
#include "service_test.h"

using namespace meshnet;
using tokens = std::vector<int32_t>;
using verdicts = std::vector<std::pair<uint64_t, bool>>;

// The caller's step of a loop: after the context 1..8, 1, 2 it feeds 3 at position 10, so
// prompt lookup drafts 4, 5, 6, 7, 8, 1, 2, ...
static pb::ForwardRequest caller_step(uint32_t drafts, uint32_t windows, uint32_t continue_tokens = 40) {
    pb::ForwardRequest request;
    request.mutable_key()->set_session_id("s");
    request.set_n_past(10);
    request.add_tokens(3);
    request.add_positions(10);
    for (int32_t token : tokens{1, 2, 3, 4, 5, 6, 7, 8, 1, 2}) {
        request.add_draft_context(token);
    }
    request.set_continue_tokens(continue_tokens);
    request.set_loop_drafts(drafts);
    request.set_loop_windows(windows);
    request.mutable_output()->set_kind(drafts > 0 ? pb::OUTPUT_KIND_VERIFIED : pb::OUTPUT_KIND_SAMPLED);
    request.mutable_output()->add_rows(0);
    return request;
}

static loop_stage_limits stage(int32_t exact_rows = 8) {
    return {7, 8, exact_rows, 100, 0};
}

static tokens tokens_of(const pb::ForwardRequest & request) {
    return {request.tokens().begin(), request.tokens().end()};
}

static tokens positions_of(const pb::ForwardRequest & request) {
    return {request.positions().begin(), request.positions().end()};
}

TEST("a loop drafts no more than the caller, the stage and the stage's exact step allow") {
    const struct {
        uint32_t asked_drafts, asked_windows;
        int32_t  exact_rows;
        int      drafts, windows;
    } table[] = {
        {3, 4, 8, 3, 4},  // the caller's asks, within the stage's
        {9, 20, 8, 7, 8}, // the stage's --max-loop-drafts and --max-loop-windows
        {5, 2, 4, 3, 2},  // a window of drafts + 1 rows no wider than the exact step
        {5, 2, 0, 0, 2},  // no exact step claimed: a plain loop
        {2, 0, 8, 2, 1},  // at least one window
    };
    for (const auto & row : table) {
        const loop_limits limits = loop_limits_for(caller_step(row.asked_drafts, row.asked_windows), stage(row.exact_rows));
        CHECK_EQ(limits.drafts, row.drafts);
        CHECK_EQ(limits.windows, row.windows);
        CHECK_EQ(limits.n_ctx, int64_t{100});
    }
}

TEST("the caller's step becomes the first window: its draft context goes, the last stage's drafts are asked for") {
    pb::ForwardRequest request = caller_step(2, 3);
    decode_loop loop(request, loop_limits_for(request, stage()), 5);
    CHECK_EQ(request.window(), uint64_t{5});
    CHECK_EQ(request.draft_context_size(), 0);
    CHECK_EQ(request.want_drafts(), 2u);
    CHECK_EQ(request.continue_tokens(), 40u);
    CHECK(tokens_of(request) == (tokens{3}));
    CHECK_EQ(loop.in_flight(), size_t{1});

    pb::ForwardRequest plain = caller_step(0, 1);
    decode_loop serial(plain, loop_limits_for(plain, stage()), 1);
    CHECK_EQ(plain.want_drafts(), 0u); // a plain loop does not pay for drafts
    CHECK(!serial.next());             // its one window is in flight
}

TEST("each next window is the caller's step at the window's positions, verified, riding the ring") {
    pb::ForwardRequest request = caller_step(2, 3);
    decode_loop loop(request, loop_limits_for(request, stage()), 1);
    const auto second = loop.next();
    const auto third  = loop.next();
    CHECK(!loop.next()); // three in flight
    CHECK(second && second->window() == 2 && second->n_past() == 11);
    CHECK(second && tokens_of(*second) == (tokens{4, 5, 6}) && positions_of(*second) == (tokens{11, 12, 13}));
    CHECK(second && second->output().kind() == pb::OUTPUT_KIND_VERIFIED && second->output().rows_size() == 0);
    CHECK(second && second->continue_tokens() == 1 && !second->has_discard_from());
    CHECK(second && second->key().session_id() == "s" && second->draft_context_size() == 0);
    CHECK(third && third->window() == 3 && tokens_of(*third) == (tokens{7, 8, 1}) && third->n_past() == 14);
    CHECK_EQ(loop.in_flight(), size_t{3});
}

TEST("an answer resolves its window as text and every later window it rejects as dropped") {
    pb::ForwardRequest request = caller_step(2, 3);
    decode_loop loop(request, loop_limits_for(request, stage()), 1);
    loop.next();
    loop.next();
    CHECK(loop.answered(1, {4}, {}) == (verdicts{{1, true}}));
    CHECK(loop.answered(2, {5, 9}, {}) == (verdicts{{2, true}, {3, false}})); // 6 was drafted: 9 came
    const auto next = loop.next();
    CHECK(next && tokens_of(*next).front() == 9 && next->discard_from() == 13 && next->n_past() == 13);
    CHECK(loop.answered(3, {7, 8, 1}, {}).empty()); // the dropped window's answer means nothing
}

TEST("answers are written in the steps' order, a loop window's once its loop said it is text") {
    answer_order order;
    const uint64_t alone  = order.queued(0);
    const uint64_t first  = order.queued(1);
    const uint64_t second = order.queued(2);
    order.answered(second);
    order.decide(2, true);
    CHECK(order.due().empty()); // the earlier steps have no answer yet
    order.answered(alone);
    CHECK(order.due() == (verdicts{{alone, true}})); // a step outside a loop goes as it comes
    order.answered(first);
    CHECK(order.due().empty()); // its loop has not resolved window 1 yet
    order.decide(1, true);
    CHECK(order.due() == (verdicts{{first, true}, {second, true}}));
    CHECK(order.due().empty());
}

TEST("a dropped window's answer is never written, is void whatever it says, and holds up nothing") {
    const struct {
        bool first_verdict, second_verdict, written, dropped;
    } table[] = {
        {true, false, true, false},  // the first verdict stands
        {false, true, false, true},
        {false, false, false, true},
    };
    for (const auto & row : table) {
        answer_order order;
        const uint64_t window = order.queued(7);
        const uint64_t after  = order.queued(0);
        CHECK(!order.dropped(window)); // not resolved yet
        order.decide(7, row.first_verdict);
        order.decide(7, row.second_verdict);
        CHECK_EQ(order.dropped(window), row.dropped);
        order.answered(after);
        order.answered(window);
        CHECK(order.due() == (verdicts{{window, row.written}, {after, true}}));
    }
}

TEST("a verdict on a window already written or never queued changes nothing") {
    answer_order order;
    const uint64_t window = order.queued(3);
    order.decide(3, true);
    order.answered(window);
    CHECK(order.due() == (verdicts{{window, true}}));
    order.decide(3, false);
    order.decide(4, false);
    const uint64_t next = order.queued(5);
    CHECK(!order.dropped(window) && !order.dropped(next));
    order.answered(next);
    CHECK(order.due().empty());
}

TEST_MAIN()
