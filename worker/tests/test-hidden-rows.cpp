// test-hidden-rows.cpp - what the MTP drafter keeps of the last stage's hidden rows (the row
// at p - 1 pairs with the token at p) and how it picks a draft from the drafter's logits.
#include "hidden_rows.h"
#include "service_test.h"

#include <vector>

using namespace meshnet;

namespace {

// n rows of width 2 whose values say their position: {pos, pos}
std::vector<float> rows_at(int32_t pos0, int32_t n) {
    std::vector<float> rows;
    for (int32_t i = 0; i < n; ++i) {
        rows.push_back(static_cast<float>(pos0 + i));
        rows.push_back(static_cast<float>(pos0 + i));
    }
    return rows;
}

bool holds(const hidden_rows & held, int32_t pos) {
    const float * row = held.at(pos);
    return row != nullptr && row[0] == static_cast<float>(pos) && row[1] == static_cast<float>(pos);
}

} // namespace

TEST("a step's rows are held by position, the latest `keep` of them") {
    hidden_rows held(2, 4);
    held.add(0, rows_at(0, 6)); // a prefill longer than what is kept
    CHECK(held.first() == 2 && held.end() == 6);
    CHECK(!held.at(1) && holds(held, 2) && holds(held, 5) && !held.at(6));
    held.add(6, rows_at(6, 1));
    CHECK(held.first() == 3 && holds(held, 6));
}

TEST("a step that starts inside what is held replaces the rows from its first position") {
    hidden_rows held(2, 8);
    held.add(0, rows_at(0, 4));
    held.add(4, rows_at(100, 3)); // a verify window's rows, about to be partly rejected
    held.add(5, rows_at(5, 2));   // the next window starts after one accepted draft
    CHECK(held.end() == 7 && holds(held, 4) == false && holds(held, 5) && holds(held, 6));
    CHECK(held.at(4)[0] == 100.0f); // the accepted row stays
}

TEST("a discard forgets the rows from its position; a gap or a restart forgets everything") {
    hidden_rows held(2, 8);
    held.add(0, rows_at(0, 5));
    held.drop_from(3);
    CHECK(held.end() == 3 && holds(held, 2) && !held.at(3));
    held.add(10, rows_at(10, 2)); // positions 3-9 never came: nothing pairs across the gap
    CHECK(held.first() == 10 && !held.at(2) && holds(held, 10));
    held.add(0, rows_at(0, 1));   // the slot started over
    CHECK(held.first() == 0 && held.end() == 1 && holds(held, 0));
    held.drop_from(0);
    CHECK(held.end() == held.first() && !held.at(0));
    held.clear();
    CHECK(!held.at(0));
}

TEST("a draft is the most likely token, the lowest id among equals") {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    CHECK(draft_argmax(logits.data(), 5) == 1);
    const std::vector<float> flat = {0.0f, 0.0f, 0.0f};
    CHECK(draft_argmax(flat.data(), 3) == 0);
}

TEST_MAIN()
