// test-prefix-slots.cpp - the prefix cache's slots over a (fake) engine and the session
// store, without the scheduler's thread: a released session's exact prefix stays as an
// entry (up to the most kept), a new session copies it, and on a memory that copies whole
// sequences only a snapshot's or a hit's copy holds its slot out until a decode landed it.
#include "fake_engine.h"
#include "prefix_slots.h"
#include "service_test.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>

using namespace meshnet;
using namespace std::chrono_literals;

namespace {

constexpr int32_t n_layer = 4;
constexpr int32_t block   = 4;

session_key key(const char * id) {
    return session_key{"r", 1, id};
}

std::vector<int32_t> tokens_from(int32_t first, int32_t n) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    std::iota(tokens.begin(), tokens.end(), first);
    return tokens;
}

bool holds(const std::vector<int32_t> & slots, int32_t slot) {
    return std::find(slots.begin(), slots.end(), slot) != slots.end();
}

std::string metadata(const shard_error & error, const std::string & name) {
    for (const auto & [key, value] : error.metadata) {
        if (key == name) return value;
    }
    return "<none>";
}

// One engine over `n_slots` slots, its sessions and their prefix slots: the steps a
// scheduler's batch would run, one session at a time.
struct stage {
    fake_engine   engine;
    session_store sessions;
    prefix_slots  slots;

    explicit stage(int32_t n_slots, void (*memory)(fake_engine &) = nullptr, int32_t entries = 1)
        : engine(n_layer, 0, n_layer, n_slots, 64), sessions(n_slots, 0ms), slots(engine, sessions) {
        if (memory) memory(engine);
        slots.configure(block, entries);
    }

    // The session's step of `tokens` at `n_past` (its slot taken first for a new session),
    // then settled as a batch; returns the slot, -1 when refused.
    int32_t step(const char * id, int64_t n_past, const std::vector<int32_t> & tokens, bool decodes = true) {
        std::vector<int32_t> busy = slots.unsettled();
        const auto admitted = sessions.admit(key(id), n_past, busy, session_clock::now());
        if (admitted.slot < 0) return -1;
        if (admitted.fresh) slots.clear(admitted.slot);
        if (!decodes) engine.fail_next_step_of(admitted.slot);
        const bool ran = run(admitted.slot, n_past, tokens);
        if (ran) slots.stepped(admitted.slot, key(id), n_past, tokens, "", "");
        slots.settle(ran);
        return admitted.slot;
    }

    // The batch's snapshot of the session's `n_past` positions in `slot`: the entry's slot
    // (which joins `busy`), -1 when none was taken.
    int32_t snapshot(int32_t slot, const char * id, int64_t n_past, std::vector<int32_t> & busy) {
        const size_t before = busy.size();
        slots.snapshot(slot, key(id), n_past, "", busy, session_clock::now());
        return busy.size() > before ? busy.back() : -1;
    }

    bool run(int32_t slot, int64_t n_past, const std::vector<int32_t> & tokens) {
        step_request request;
        request.slot = slot;
        request.tokens = tokens;
        request.positions.resize(tokens.size());
        std::iota(request.positions.begin(), request.positions.end(), static_cast<int32_t>(n_past));
        request.output_rows = {static_cast<int32_t>(tokens.size()) - 1};
        return engine.step({request}).at(0).status == engine_status::ok;
    }
};

void copies_prefix(fake_engine & engine) {
    engine.set_copies_prefix();
}

void copies_whole(fake_engine & engine) {
    engine.set_copies_whole();
}

} // namespace

TEST("off on an engine that cannot copy a prefix: a release clears the slot, every lookup misses") {
    stage s(2);
    CHECK_EQ(s.slots.block(), 0);
    const int32_t slot = s.step("a", 0, tokens_from(1, block));
    CHECK(s.slots.release(key("a")));
    CHECK(!s.slots.release(key("a"))); // it held no slot any more
    CHECK_EQ(s.engine.slot_n_past(slot), 0);
    std::optional<shard_error> miss;
    const std::vector<int32_t> asked = tokens_from(1, block);
    CHECK_EQ(s.slots.source({key("b"), block, asked, {}, ""}, miss), -1);
    CHECK(miss && miss->reason == error_reason::cache_miss);
    CHECK_EQ(metadata(*miss, "prefix_held"), std::string("0"));
    const prefix_counts counts = s.slots.stats();
    CHECK(counts.lookups == 1 && counts.hits == 0 && counts.entries == 0);
}

TEST("a released session's exact prefix stays as an entry, the least recently used beyond the most cleared") {
    stage s(3, copies_prefix, 1);
    const int32_t a = s.step("a", 0, tokens_from(1, block));
    s.step("a", block, tokens_from(5, 2)); // a part block: not in the exact prefix
    CHECK(s.slots.release(key("a")));
    CHECK_EQ(s.engine.slot_n_past(a), block + 2); // kept as it is: a hit drops the rest
    prefix_counts counts = s.slots.stats();
    CHECK(counts.entries == 1 && counts.entry_tokens == block);
    const int32_t b = s.step("b", 0, tokens_from(20, block));
    CHECK(s.slots.release(key("b")));
    counts = s.slots.stats();
    CHECK(counts.entries == 1 && counts.entry_tokens == block);
    CHECK_EQ(s.engine.slot_n_past(a), 0); // a's entry went for b's
    CHECK_EQ(s.engine.slot_n_past(b), block);
    const int32_t c = s.step("c", 0, tokens_from(1, 3)); // no whole block: nothing to keep
    CHECK(s.slots.release(key("c")));
    CHECK_EQ(s.engine.slot_n_past(c), 0);
    CHECK_EQ(s.slots.stats().entries, 1);
}

TEST("a new session copies the longest exact prefix it asks for, and misses with what is held") {
    stage s(3, copies_prefix);
    const int32_t a = s.step("a", 0, tokens_from(1, block));
    s.slots.release(key("a"));
    std::optional<shard_error> miss;
    const std::vector<int32_t> asked = tokens_from(1, block);
    const int32_t source = s.slots.source({key("b"), block, asked, {}, ""}, miss);
    CHECK(!miss);
    CHECK_EQ(source, a);
    std::vector<int32_t> busy;
    const auto admitted = s.sessions.admit(key("b"), block, busy, session_clock::now(), source);
    std::vector<std::string> chain;
    CHECK(s.slots.copy(source, admitted.slot, key("b"), block, busy, session_clock::now(), chain));
    CHECK_EQ(s.engine.slot_n_past(admitted.slot), block);
    CHECK(busy.empty()); // the copy is there at once: nothing held out
    CHECK(s.run(admitted.slot, block, {9}));
    const prefix_counts counts = s.slots.stats();
    CHECK(counts.lookups == 1 && counts.hits == 1 && counts.reused_tokens == block);

    std::vector<int32_t> longer = tokens_from(1, 2 * block);
    CHECK_EQ(s.slots.source({key("c"), 2 * block, longer, {}, ""}, miss), -1); // one block of two
    CHECK(miss && metadata(*miss, "prefix_held") == std::to_string(block));
    miss.reset();
    const std::vector<int32_t> other_salt = tokens_from(1, block);
    CHECK_EQ(s.slots.source({key("c"), block, other_salt, {}, "tenant"}, miss), -1);
    CHECK(miss && metadata(*miss, "prefix_held") == "0");
}

TEST("whole only: a snapshot is an entry at once, its slot held by the batch until its decode") {
    stage s(3, copies_whole);
    const int32_t a = s.step("a", 0, tokens_from(1, block));
    std::vector<int32_t> busy;
    const int32_t entry = s.snapshot(a, "a", block, busy);
    CHECK(entry >= 0 && entry != a && s.slots.stats().entries == 1);
    CHECK_EQ(s.snapshot(a, "a", block, busy), -1); // held already
    CHECK(busy == (std::vector<int32_t>{entry}));
    CHECK(s.run(a, block, {9})); // the batch's decode lands it
    s.slots.settle(true);
    CHECK(s.slots.unsettled().empty());
    CHECK_EQ(s.engine.pending_copies(), size_t{0});
    const prefix_counts counts = s.slots.stats();
    CHECK(counts.entries == 1 && counts.entry_tokens == block && counts.snapshots_skipped == 0);
    s.slots.release(key("a")); // a whole-only memory keeps no released session: its entries are snapshots
    CHECK_EQ(s.slots.stats().entries, 1);
    CHECK_EQ(s.engine.slot_n_past(a), 0);
}

TEST("whole only: a snapshot of positions not all fed on the grid is skipped") {
    stage s(3, copies_whole);
    const int32_t a = s.step("a", 0, tokens_from(1, 3));
    std::vector<int32_t> busy;
    CHECK_EQ(s.snapshot(a, "a", 3, busy), -1);
    CHECK(busy.empty());
    CHECK(s.slots.stats().entries == 0 && s.slots.stats().snapshots_skipped == 1);
}

TEST("whole only: a copy no decode landed holds its slot out, its entry dropped, until a decode has") {
    stage s(2, copies_whole);
    const int32_t a = s.step("a", 0, tokens_from(1, block));
    std::vector<int32_t> busy;
    const int32_t entry = s.snapshot(a, "a", block, busy);
    CHECK(entry >= 0);
    if (entry < 0) return;
    s.engine.fail_next_step_of(a);
    CHECK(!s.run(a, block, {9}));
    CHECK_EQ(s.engine.pending_copies(), size_t{1}); // it lands at whatever decode comes next
    s.slots.settle(false);
    CHECK(s.slots.unsettled() == (std::vector<int32_t>{entry}));
    CHECK_EQ(s.slots.stats().entries, 0); // never an entry that may not hold what it says
    s.slots.release(key("a")); // the engine cleared a's slot

    busy = s.slots.unsettled(); // the next batch: b and c, one slot free for them
    const auto b = s.sessions.admit(key("b"), 0, busy, session_clock::now());
    CHECK_EQ(b.slot, a);
    busy.push_back(b.slot);
    CHECK(s.sessions.admit(key("c"), 0, busy, session_clock::now()).refused ==
          session_store::admission::refusal::capacity_exhausted);
    s.slots.clear(b.slot);
    CHECK(s.run(b.slot, 0, {7}));
    s.slots.settle(true);
    CHECK(s.slots.unsettled().empty()); // b's decode landed it
    CHECK_EQ(s.engine.slot_n_past(entry), 0); // and what landed there is no one's
    CHECK_EQ(s.step("c", 0, {8}), entry);
    CHECK_EQ(s.engine.copies_onto_live(), 0);
}

TEST("whole only: a hit's copy no decode landed releases its session and holds the slot out") {
    stage s(3, copies_whole);
    const int32_t a = s.step("a", 0, tokens_from(1, block));
    std::vector<int32_t> busy;
    const int32_t entry = s.snapshot(a, "a", block, busy);
    CHECK(entry >= 0);
    if (entry < 0) return;
    CHECK(s.run(a, block, {9}));
    s.slots.settle(true);

    std::optional<shard_error> miss;
    const std::vector<int32_t> asked = tokens_from(1, block);
    CHECK_EQ(s.slots.source({key("b"), block, asked, {}, ""}, miss), entry);
    busy = s.slots.unsettled();
    const auto admitted = s.sessions.admit(key("b"), block, busy, session_clock::now(), entry);
    std::vector<std::string> chain;
    CHECK(s.slots.copy(entry, admitted.slot, key("b"), block, busy, session_clock::now(), chain));
    CHECK(holds(busy, entry)); // its copy reads the entry at the decode
    s.engine.fail_next_step_of(admitted.slot);
    CHECK(!s.run(admitted.slot, block, {9}));
    s.slots.settle(false);
    CHECK_EQ(s.sessions.find(key("b")), -1); // its slot holds no state it may build on
    CHECK(holds(s.slots.unsettled(), admitted.slot));
}

TEST_MAIN()
