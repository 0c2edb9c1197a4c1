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

TEST_MAIN()
