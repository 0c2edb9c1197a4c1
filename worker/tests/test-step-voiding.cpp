// test-step-voiding.cpp - which queued steps are void, as a table: a later step's discard
// voids the windows queued before it at or above it, a rejection mark voids the session's
// windows from the rejected row on until the step after the rejection, and a non-last
// stage does not pass on a step that a queued discard voids.
#include "service_test.h"
#include "step_voiding.h"

#include <cstdio>
#include <set>
#include <string>
#include <vector>

using namespace meshnet;

namespace {

session_key key(char id) {
    return session_key{"r", 1, std::string(1, id)};
}

// "a5 b3 a4d4": session a at n_past 5, b at 3, a at 4 discarding from 4 (in arrival order)
std::vector<queued_window> queue_of(const std::string & spec) {
    std::vector<queued_window> queue;
    size_t i = 0;
    while (i < spec.size()) {
        const size_t      end  = spec.find(' ', i);
        const std::string item = spec.substr(i, end == std::string::npos ? std::string::npos : end - i);
        const size_t      d    = item.find('d');
        queue.push_back({key(item[0]), std::stoll(item.substr(1, d == std::string::npos ? std::string::npos : d - 1)),
                         d == std::string::npos ? -1 : std::stoll(item.substr(d + 1))});
        i = end == std::string::npos ? spec.size() : end + 1;
    }
    return queue;
}

// the sessions that hold a slot: their letters
session_live live_of(const std::string & letters) {
    return [letters](const session_key & k) { return letters.find(k.session_id) != std::string::npos; };
}

struct row {
    const char *         marks; // "a5": the last stage rejected a's drafts from row 5 on
    const char *         live;
    const char *         queue;
    std::vector<int64_t> void_from;
    size_t               marks_left;
};

std::string shown(const std::vector<int64_t> & values) {
    std::string text;
    for (int64_t value : values) text += " " + std::to_string(value);
    return text;
}

} // namespace

TEST("the voiding rule's table") {
    const std::vector<row> table = {
        {"",   "ab", "a5 b5",          {-1, -1},         0}, // nothing marked, nothing discards
        {"",   "a",  "a5 a4d4",        {4, -1},          0}, // a later discard voids a window above it
        {"",   "a",  "a4 a5d5 a6",     {-1, -1, -1},     0}, // below the discard, or queued after it: runs
        {"",   "a",  "a4 a4d4",        {4, -1},          0}, // at the discard: void
        {"",   "ab", "a5 b4d4",        {-1, -1},         0}, // another session's discard
        {"",   "a",  "a6 a5d5 a7d7",   {5, -1, -1},      0}, // the lowest later discard counts
        {"",   "a",  "a4 a6d4 a5d5",   {-1, 5, -1},      0}, // a void step's discard voids nothing
        {"a5", "a",  "a5 a7",          {5, 5},           1}, // a rejection voids the windows after it
        {"a5", "a",  "a4 a5",          {-1, -1},         0}, // a step below the mark clears it
        {"a5", "a",  "a5 a4d4 a5",     {5, -1, -1},      0}, // the step after the rejection clears it
        {"a5", "",   "a5 a6",          {-1, -1},         0}, // a session gone: its mark goes
        {"a5", "ab", "b5 b6",          {-1, -1},         1}, // another session's mark
        {"a5", "a",  "a6 a5d5",        {5, -1},          0}, // both rules at once
        {"",   "a",  "",               {},               0},
    };
    for (const row & r : table) {
        step_voiding voiding;
        const std::vector<queued_window> marks = queue_of(r.marks);
        for (const queued_window & mark : marks) voiding.rejected_from(mark.key, mark.n_past, 8, live_of(r.live));
        const std::vector<int64_t> void_from = voiding.void_from(queue_of(r.queue), live_of(r.live));
        if (void_from != r.void_from || voiding.marks() != r.marks_left) {
            std::printf("  marks \"%s\" live \"%s\" queue \"%s\": void from%s, %zu marks left\n", r.marks, r.live,
                        r.queue, shown(void_from).c_str(), voiding.marks());
        }
        CHECK(void_from == r.void_from);
        CHECK_EQ(voiding.marks(), r.marks_left);
    }
}

TEST("a session's lowest rejection counts and lasts until the step after it") {
    step_voiding voiding;
    const session_live live = live_of("a");
    voiding.rejected_from(key('a'), 7, 8, live);
    voiding.rejected_from(key('a'), 5, 8, live);
    voiding.rejected_from(key('a'), 9, 8, live);
    CHECK(voiding.void_from(queue_of("a5"), live) == (std::vector<int64_t>{5}));
    CHECK(voiding.void_from(queue_of("a6"), live) == (std::vector<int64_t>{5})); // a later queue: still marked
    CHECK(voiding.void_from(queue_of("a5d5"), live) == (std::vector<int64_t>{-1}));
    CHECK(voiding.void_from(queue_of("a6"), live) == (std::vector<int64_t>{-1}));
}

TEST("a released session's mark goes: one made anew under its key starts unmarked") {
    step_voiding voiding;
    const session_live live = live_of("a");
    voiding.rejected_from(key('a'), 5, 8, live);
    voiding.released(key('a'));
    CHECK_EQ(voiding.marks(), size_t{0});
    CHECK(voiding.void_from(queue_of("a5"), live) == (std::vector<int64_t>{-1}));
}

TEST("past one mark per slot, the marks of sessions evicted since go") {
    step_voiding voiding;
    voiding.rejected_from(key('a'), 5, 2, live_of("ac"));
    voiding.rejected_from(key('b'), 5, 2, live_of("ac")); // b is gone, but two marks fit
    CHECK_EQ(voiding.marks(), size_t{2});
    voiding.rejected_from(key('c'), 5, 2, live_of("ac"));
    CHECK_EQ(voiding.marks(), size_t{2});
    CHECK(voiding.void_from(queue_of("a5 b5 c5"), live_of("abc")) == (std::vector<int64_t>{5, -1, 5}));
}

TEST("a step that ran is not passed on when a queued discard of its session voids it") {
    struct ran_row {
        char         session;
        int64_t      n_past;
        const char * queue;
        int64_t      void_from;
    };
    const std::vector<ran_row> table = {
        {'a', 4, "",            -1},
        {'a', 4, "a4d4",         4},
        {'a', 3, "a4d4",        -1}, // below the discard: the next window builds on it
        {'a', 4, "b4d4",        -1}, // another session's
        {'a', 5, "a6d6 a4d4",    4}, // the lowest discard
        {'a', 7, "a6 a8d8 a6d6", 6},
        {'a', 4, "a4 a5",       -1}, // queued, not discarding
    };
    for (const ran_row & r : table) {
        const int64_t from = void_after_run(key(r.session), r.n_past, queue_of(r.queue));
        if (from != r.void_from) {
            std::printf("  %c at %lld, queue \"%s\": void from %lld\n", r.session, static_cast<long long>(r.n_past),
                        r.queue, static_cast<long long>(from));
        }
        CHECK_EQ(from, r.void_from);
    }
}

TEST_MAIN()
