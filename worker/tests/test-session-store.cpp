// test-session-store.cpp - slots are bounded, idle sessions are evicted least recently
// used first, and busy or recently used sessions are never evicted.
#include "service_test.h"
#include "session_store.h"

using namespace meshnet;
using namespace std::chrono_literals;

static session_key key(const char * id) { return session_key{"route", 1, id}; }

TEST("new sessions take free slots until none is left") {
    session_store store(2, 0ms);
    const auto t = session_clock::now();
    const auto a = store.acquire(key("a"), {}, t);
    const auto b = store.acquire(key("b"), {}, t);
    CHECK(a.created && b.created);
    CHECK(a.slot != b.slot);
    CHECK_EQ(store.slots_free(), 0);
    CHECK_EQ(store.acquire(key("a"), {}, t).slot, a.slot);
    CHECK(!store.acquire(key("a"), {}, t).created);
}

TEST("the least recently used idle session is evicted for a new one") {
    session_store store(2, 0ms);
    const auto t = session_clock::now();
    const int32_t slot_a = store.acquire(key("a"), {}, t).slot;
    store.acquire(key("b"), {}, t + 1ms);
    store.touch(key("a"), t + 2ms);  // b is now the least recently used
    const auto c = store.acquire(key("c"), {}, t + 3ms);
    CHECK(c.evicted);
    CHECK(c.evicted_key == key("b"));
    CHECK(c.slot != slot_a);
    CHECK_EQ(store.find(key("b")), -1);
    CHECK_EQ(store.find(key("a")), slot_a);
}

TEST("sessions in the running step or inside the grace are never evicted") {
    session_store store(1, 1000ms);
    const auto t = session_clock::now();
    const int32_t slot = store.acquire(key("a"), {}, t).slot;
    CHECK_EQ(store.acquire(key("b"), {}, t + 10ms).slot, -1);             // within the grace
    CHECK_EQ(store.acquire(key("b"), {slot}, t + 2000ms).slot, -1);       // busy in this step
    CHECK_EQ(store.acquire(key("b"), {}, t + 2000ms).slot, slot);         // idle long enough
}

TEST("releasing a session frees its slot and a second release finds nothing") {
    session_store store(1, 0ms);
    const auto t = session_clock::now();
    const int32_t slot = store.acquire(key("a"), {}, t).slot;
    CHECK_EQ(store.release(key("a")), slot);
    CHECK_EQ(store.release(key("a")), -1);
    CHECK_EQ(store.slots_free(), 1);
    CHECK_EQ(store.active(), 0);
}

TEST("the same session id under another epoch is another session") {
    session_store store(2, 0ms);
    const auto t = session_clock::now();
    store.acquire(session_key{"route", 1, "s"}, {}, t);
    CHECK_EQ(store.find(session_key{"route", 2, "s"}), -1);
}

TEST("sessions used within the window count as mid-generation") {
    session_store store(3, 0ms);
    const auto t = session_clock::now();
    store.acquire(key("a"), {}, t);
    store.acquire(key("b"), {}, t + 50ms);
    store.acquire(key("c"), {}, t + 200ms);
    CHECK_EQ(store.recently_used(t + 210ms, 100ms), 1);
    CHECK_EQ(store.recently_used(t + 210ms, 200ms), 2);
}

using refusal = session_store::admission::refusal;

TEST("admission: a new session at n_past 0 gets a fresh slot, its next step the same one") {
    session_store store(2, 0ms);
    const auto t = session_clock::now();
    const auto first = store.admit(key("a"), 0, {}, t);
    CHECK(first.refused == refusal::none);
    CHECK(first.fresh);
    CHECK(first.slot >= 0);
    const auto next = store.admit(key("a"), 3, {}, t);
    CHECK(next.refused == refusal::none);
    CHECK(!next.fresh); // its KV holds the positions the step builds on
    CHECK_EQ(next.slot, first.slot);
}

TEST("admission: a step past n_past 0 of a session held nowhere is a cache miss, and takes no slot") {
    session_store store(2, 0ms);
    const auto t = session_clock::now();
    const auto missed = store.admit(key("a"), 5, {}, t);
    CHECK(missed.refused == refusal::cache_miss);
    CHECK_EQ(missed.slot, -1);
    CHECK(!missed.fresh);
    CHECK_EQ(store.find(key("a")), -1);
    CHECK_EQ(store.slots_free(), 2);
}

TEST("admission: with no slot free or evictable a new session is refused for capacity") {
    session_store store(1, 1000ms);
    const auto t = session_clock::now();
    const int32_t slot = store.admit(key("a"), 0, {}, t).slot;
    const auto refused = store.admit(key("b"), 0, {}, t + 10ms); // a is within the grace
    CHECK(refused.refused == refusal::capacity_exhausted);
    CHECK_EQ(refused.slot, -1);
    CHECK(store.admit(key("b"), 0, {slot}, t + 2000ms).refused == refusal::capacity_exhausted); // busy
    const auto evicting = store.admit(key("b"), 0, {}, t + 2000ms);
    CHECK(evicting.refused == refusal::none);
    CHECK(evicting.fresh); // the slot a held: the caller clears it
    CHECK_EQ(evicting.slot, slot);
    CHECK(store.admit(key("a"), 4, {}, t + 2000ms).refused == refusal::cache_miss); // a was evicted
}

TEST_MAIN()
