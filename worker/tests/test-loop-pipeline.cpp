// test-loop-pipeline.cpp - a decode loop's verify windows (loop_pipeline): what is sent
// next, and what each answer means for the windows still in flight, without a transport.
#include "loop_pipeline.h"
#include "service_test.h"

using namespace meshnet;
using tokens = std::vector<int32_t>;

// The context repeats 1..8, so prompt lookup drafts its continuation: after (1, 2, 3)
// come 4, 5, 6, 7, 8, 1, 2, ...
static const tokens context = {1, 2, 3, 4, 5, 6, 7, 8, 1, 2};

static loop_pipeline pipeline(int drafts, int windows, int64_t wanted = 40, int64_t discard_depth = 0,
                              int64_t n_ctx = 100, tokens stops = {}) {
    loop_window first;
    first.id     = 1;
    first.n_past = static_cast<int64_t>(context.size());
    first.tokens = {3};
    return loop_pipeline({drafts, windows, n_ctx, discard_depth}, context, first, wanted, std::move(stops));
}

static bool answers_only(const std::vector<std::pair<uint64_t, loop_answer>> & resolved, uint64_t id) {
    return resolved.size() == 1 && resolved[0].first == id && resolved[0].second.answer &&
           resolved[0].second.dropped.empty();
}

TEST("a plain loop sends one token at a time, each the token answered before") {
    loop_pipeline loop = pipeline(0, 4);
    CHECK(!loop.next()); // the first window is in flight
    CHECK(answers_only(loop.answered(1, {42}), 1));
    const auto next = loop.next();
    CHECK(next && next->tokens == (tokens{42}) && next->n_past == 11 && !next->verify && next->discard_from < 0);
    CHECK(!loop.next());
    CHECK_EQ(loop.depth(), 1);
}

TEST("pipelined windows are drafted one after another, each first token in place of the answer before it") {
    loop_pipeline loop = pipeline(2, 3);
    const auto second = loop.next();
    const auto third  = loop.next();
    CHECK(second && second->tokens == (tokens{4, 5, 6}) && second->n_past == 11 && second->verify);
    CHECK(third && third->tokens == (tokens{7, 8, 1}) && third->n_past == 14 && third->discard_from < 0);
    CHECK(!loop.next()); // three in flight: the depth
    CHECK_EQ(loop.deepest(), 3);
}

TEST("an answer that confirms the whole window and the next one's first token lets the pipeline run on") {
    loop_pipeline loop = pipeline(2, 3);
    loop.next();
    loop.next();
    CHECK(answers_only(loop.answered(1, {4}), 1));
    const auto fourth = loop.next(); // drafted after the windows still in flight
    CHECK(fourth && fourth->tokens == (tokens{2, 3, 4}) && fourth->n_past == 17);
    CHECK(answers_only(loop.answered(2, {5, 6, 7}), 2));
    CHECK_EQ(loop.in_flight(), size_t{2});
}

TEST("a rejection inside a window drops every later one and the next starts from the answer, discarding") {
    loop_pipeline loop = pipeline(2, 3);
    loop.next();
    loop.next();
    loop.answered(1, {4});
    const auto resolved = loop.answered(2, {5, 9}); // 5 held, 6 did not: 9 instead
    CHECK(resolved.size() == 1 && resolved[0].second.answer && resolved[0].second.dropped == (std::vector<uint64_t>{3}));
    const auto next = loop.next();
    CHECK(next && next->tokens.front() == 9 && next->n_past == 13 && next->discard_from == 13 && next->id == 4);
}

TEST("a rejection of the next window's first token alone drops it too") {
    loop_pipeline loop = pipeline(2, 3);
    loop.next();
    loop.next();
    loop.answered(1, {4});
    const auto resolved = loop.answered(2, {5, 6, 0}); // every draft held, then 0 where 7 was drafted
    CHECK(resolved.size() == 1 && resolved[0].second.dropped == (std::vector<uint64_t>{3}));
    const auto next = loop.next();
    CHECK(next && next->tokens.front() == 0 && next->n_past == 14 && next->discard_from == 14);
    CHECK(loop.answered(3, {7, 7, 7}).empty()); // the dropped window's answer means nothing
}

TEST("a rejection at each position of a window drops the later windows and discards from the answer on") {
    // The second window [4, 5, 6] at positions 11..13 is followed by [7, 8, 1] at 14..16.
    for (size_t held = 0; held <= 2; ++held) { // its drafts 5, 6 that hold; at 2 the next first token fails
        loop_pipeline loop = pipeline(2, 3);
        loop.next();
        loop.next();
        loop.answered(1, {4});
        const tokens drafts = {5, 6};
        tokens answer(drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(held));
        answer.push_back(60); // the sample where the next draft was expected
        const auto resolved = loop.answered(2, answer);
        CHECK(resolved.size() == 1 && resolved[0].second.answer);
        CHECK(resolved[0].second.dropped == (std::vector<uint64_t>{3}));
        const auto next = loop.next();
        const int64_t from = 11 + static_cast<int64_t>(answer.size());
        CHECK(next && next->tokens.front() == 60 && next->n_past == from && next->discard_from == from);
    }
}

TEST("answers taken out of order resolve nothing until the window before comes") {
    loop_pipeline loop = pipeline(2, 3);
    loop.next();
    loop.next();
    CHECK(loop.answered(2, {5, 6, 7}).empty());
    const auto resolved = loop.answered(1, {4});
    CHECK(resolved.size() == 2 && resolved[0].first == 1 && resolved[1].first == 2);
}

TEST("the depth falls to one window at a rejection and grows by one per window accepted whole") {
    loop_pipeline loop = pipeline(2, 3);
    loop.next();
    loop.next();
    loop.answered(1, {4});
    loop.next();                 // the fourth window, [2, 3, 4]
    loop.answered(2, {5, 6, 7});
    CHECK_EQ(loop.depth(), 3);
    loop.answered(3, {8, 1, 0}); // the drafted 2 of the fourth window failed
    CHECK_EQ(loop.depth(), 1);
    auto window = loop.next();   // [0] at 17, nothing to draft after (0)
    CHECK(window && window->tokens == (tokens{0}));
    CHECK(!loop.next());
    loop.answered(window->id, {1});
    CHECK_EQ(loop.depth(), 2);
}

TEST("the depth stays at one while drafts fail, and the stages' discard depth bounds the rows in flight") {
    loop_pipeline failing = pipeline(2, 3);
    failing.next();
    failing.next();
    failing.answered(1, {0}); // the second window's first token was wrong
    CHECK_EQ(failing.depth(), 1);

    loop_pipeline shallow = pipeline(2, 3, 40, /*discard_depth =*/ 3);
    const auto second = shallow.next();
    CHECK(second && second->tokens.size() == 3); // 1 + 3 rows in flight: 3 may be dropped at once
    CHECK(!shallow.next());
}

TEST("no window carries more rows than tokens are wanted or positions are left") {
    loop_pipeline few = pipeline(2, 3, /*wanted =*/ 3);
    const auto second = few.next();
    CHECK(second && second->tokens.size() == 2);
    CHECK(!few.next());

    loop_pipeline tight = pipeline(2, 3, 40, 0, /*n_ctx =*/ 12);
    const auto last = tight.next();
    CHECK(last && last->tokens.size() == 1);
    CHECK(!tight.next());
}

TEST("a stop token ends the loop and voids what is in flight after it") {
    loop_pipeline loop = pipeline(2, 3, 40, 0, 100, /*stops =*/ {6});
    loop.next();
    loop.next();
    loop.answered(1, {4});
    const auto resolved = loop.answered(2, {5, 6, 7});
    CHECK(resolved.size() == 1 && resolved[0].second.done && resolved[0].second.dropped == (std::vector<uint64_t>{3}));
    CHECK(loop.done() && !loop.next());
}

TEST("a window that starts from an answered token takes the last stage's drafts instead of lookup's") {
    loop_pipeline loop = pipeline(3, 1);
    CHECK(answers_only(loop.answered(1, {42}, {90, 91, 92, 93}), 1));
    const auto next = loop.next(); // lookup would draft nothing after 42
    CHECK(next && next->tokens == (tokens{42, 90, 91, 92}) && next->verify && next->n_past == 11);
    CHECK(!loop.next());
    // a rejection: the next window starts from the answer, with the drafts that came with it
    const auto resolved = loop.answered(next->id, {90, 17}, {60, 61, 62});
    CHECK(answers_only(resolved, next->id));
    const auto after = loop.next();
    CHECK(after && after->tokens == (tokens{17, 60, 61, 62}) && after->n_past == 13 && after->discard_from == 13);
    // an answer without drafts (the last stage could not draft): prompt lookup again
    CHECK(answers_only(loop.answered(after->id, {60, 61, 62, 1}), after->id));
    const auto lookup = loop.next();
    CHECK(lookup && lookup->tokens.front() == 1 && lookup->tokens.size() > 1);
}

TEST("the last stage's drafts are cut to the loop's draft limit, the context and the discard depth") {
    loop_pipeline capped = pipeline(2, 1);
    capped.answered(1, {42}, {90, 91, 92, 93});
    const auto two = capped.next();
    CHECK(two && two->tokens == (tokens{42, 90, 91}));
    loop_pipeline shallow = pipeline(3, 1, 40, /*discard_depth =*/ 1);
    shallow.answered(1, {42}, {90, 91, 92});
    const auto one = shallow.next();
    CHECK(one && one->tokens == (tokens{42, 90}));
    loop_pipeline near_end = pipeline(3, 1, 40, 0, /*n_ctx =*/ 13);
    near_end.answered(1, {42}, {90, 91, 92});
    const auto fits = near_end.next(); // positions 11 and 12 are the context's last
    CHECK(fits && fits->tokens == (tokens{42, 90}));
    loop_pipeline plain = pipeline(0, 1);
    plain.answered(1, {42}, {90, 91});
    const auto alone = plain.next(); // a plain loop never verifies
    CHECK(alone && alone->tokens == (tokens{42}) && !alone->verify);
}

TEST_MAIN()
