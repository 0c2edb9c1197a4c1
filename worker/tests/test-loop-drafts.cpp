// test-loop-drafts.cpp - the first stage's drafts for a speculative loop: prompt lookup
// and the adaptive draft length, on the same cases as the driver's own
// (tests/route/test_drafts.py), so both draft alike.
#include "loop_drafts.h"
#include "service_test.h"

using namespace meshnet;

static prompt_lookup lookup(const std::vector<int32_t> & tokens) {
    prompt_lookup index;
    index.extend(tokens);
    return index;
}

using tokens = std::vector<int32_t>;

TEST("the longest earlier match of the suffix proposes what followed it") {
    CHECK(lookup({5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7}).draft(3) == (tokens{2, 6, 7}));
    // the 3-gram (1, 2, 3) wins over the later occurrence of the 2-gram (2, 3)
    CHECK(lookup({1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3}).draft(2) == (tokens{4, 9}));
}

TEST("a draft is cut at the end of the context and at the length") {
    CHECK(lookup({4, 4}).draft(5) == (tokens{4}));
    CHECK(lookup({1, 2, 3, 1, 2}).draft(1) == (tokens{3}));
    CHECK(lookup({1, 2, 3, 1, 2}).draft(0).empty());
}

TEST("nothing is drafted when the suffix never occurred") {
    CHECK(lookup({1, 2, 3, 4}).draft(4).empty());
    CHECK(lookup({}).draft(4).empty());
}

TEST("the index grows with the tokens") {
    prompt_lookup index = lookup({1, 2, 3});
    CHECK(index.draft(2).empty());
    index.extend({9, 1, 2});
    CHECK(index.draft(2) == (tokens{3, 9}));
    index.extend({7});
    CHECK(index.draft(2).empty());
}

TEST("the length doubles on full acceptance and falls to what held") {
    draft_length length(5);
    length.verified(5, 2);
    CHECK_EQ(length.wanted(), 2);
    length.verified(2, 2);
    CHECK_EQ(length.wanted(), 4);
    length.verified(4, 4);
    CHECK_EQ(length.wanted(), 5); // capped
    length.verified(2, 0);
    CHECK_EQ(length.wanted(), 1);
}

TEST("drafting pauses for 8 tokens after 3 failures in a row, and longer while probes fail") {
    draft_length length(4);
    for (int i = 0; i < 3; ++i) {
        CHECK(length.wanted() > 0);
        length.verified(1, 0);
    }
    CHECK_EQ(length.wanted(), 0);
    length.decoded_plainly(7);
    CHECK_EQ(length.wanted(), 0);
    length.decoded_plainly(1);
    CHECK_EQ(length.wanted(), 1); // the probe
    length.verified(1, 0);        // fails: a pause of 16 at once
    length.decoded_plainly(15);
    CHECK_EQ(length.wanted(), 0);
    length.decoded_plainly(1);
    length.verified(1, 1); // a probe that holds ends the failures
    CHECK_EQ(length.wanted(), 2);
    length.verified(2, 0);
    CHECK_EQ(length.wanted(), 1); // one failure: no pause yet
}

TEST("a loop's drafter extends its context with what each step answered") {
    loop_drafter drafter(4, {1, 2, 3, 4, 1});
    CHECK(drafter.next(4) == (tokens{2, 3, 4, 1}));
    drafter.answered({1, 2, 3, 4, 1}, {2, 3, 9}); // two of four drafts held, then 9
    CHECK(drafter.next(4).empty());               // nothing followed (9) before
    drafter.answered({9}, {1});                   // a plain step
    CHECK(drafter.next(4) == (tokens{2, 3}));     // after (1): the length fell to 2
    CHECK(drafter.next(1) == (tokens{2}));        // and the room cuts it
}

TEST_MAIN()
