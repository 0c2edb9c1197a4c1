// test-prefix-cache.cpp - a slot's exact prefix grows only by whole blocks fed as one step
// at the grid, matches compare tokens and never cross routes or epochs, and a kept entry
// gives its slot to any session that needs one before a live session is evicted. A memory
// that copies whole sequences only (deepseek4) reuses an entry whole or not at all, and its
// snapshots take a free slot or an entry's, never a live session's. A stage after the
// first matches only blocks computed from the boundary the request's digest chain names.
#include "prefix_cache.h"
#include "prefix_digest.h"
#include "service_test.h"
#include "session_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <utility>

using namespace meshnet;
using namespace std::chrono_literals;

static std::vector<int32_t> tokens_from(int32_t first, int32_t n) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    std::iota(tokens.begin(), tokens.end(), first);
    return tokens;
}

TEST("only whole blocks at the grid extend a slot's exact prefix") {
    prefix_cache cache(2, 4);
    cache.stepped(0, "r", 1, 0, tokens_from(0, 4));
    cache.stepped(0, "r", 1, 4, tokens_from(4, 4));
    CHECK_EQ(cache.held(0), 8);
    cache.stepped(0, "r", 1, 8, tokens_from(8, 3)); // a partial block ends the prefix here
    cache.stepped(0, "r", 1, 11, tokens_from(11, 4));
    CHECK_EQ(cache.held(0), 8);
    cache.stepped(1, "r", 1, 0, tokens_from(0, 8)); // two blocks in one step: not a cold run's
    CHECK_EQ(cache.held(1), 0);
    cache.truncated(0, 6); // a discard inside the second block drops it
    CHECK_EQ(cache.held(0), 4);
}

TEST("a match is the longest run of whole blocks with the same tokens") {
    prefix_cache cache(2, 4);
    for (int32_t n_past = 0; n_past < 12; n_past += 4) {
        cache.stepped(1, "r", 1, n_past, tokens_from(n_past, 4));
    }
    std::vector<int32_t> asked = tokens_from(0, 10);
    asked[9] = 99; // differs inside the third block
    const auto found = cache.find("r", 1, asked, {}, {0, 1});
    CHECK_EQ(found.slot, 1);
    CHECK_EQ(found.held, 8);
    asked[1] = 99;
    CHECK_EQ(cache.find("r", 1, asked, {}, {0, 1}).held, 0);
}

TEST("another epoch's or route's prefix is never matched") {
    prefix_cache cache(1, 4);
    cache.stepped(0, "r", 1, 0, tokens_from(0, 4));
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 5), {}, {0}).held, 4);
    CHECK_EQ(cache.find("r", 2, tokens_from(0, 5), {}, {0}).held, 0);
    CHECK_EQ(cache.find("s", 1, tokens_from(0, 5), {}, {0}).held, 0);
}

TEST("a prefix is matched only for the salt it was computed for, and another salt's step ends it") {
    prefix_cache cache(2, 4);
    cache.stepped(0, "r", 1, 0, tokens_from(0, 4), "tenant-a");
    cache.stepped(0, "r", 1, 4, tokens_from(4, 4), "tenant-a");
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 9), {}, {0}, "tenant-a").held, 8);
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 9), {}, {0}, "tenant-b").held, 0);
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 9), {}, {0}).held, 0); // the shared cache neither
    cache.stepped(1, "r", 1, 0, tokens_from(0, 4));
    cache.stepped(1, "r", 1, 4, tokens_from(4, 4), "tenant-b");
    CHECK_EQ(cache.held(1), 4);
}

TEST("a later stage matches only the blocks computed from the boundary the request's chain names") {
    prefix_cache cache(2, 4, false, prefix_cache::roles{true, false});
    const std::string pirate = sha256_digest("a pirate's boundary"), victim = sha256_digest("the victim's boundary");
    const std::string next = sha256_digest("the next block's boundary");
    // the victim's ids sent with another text's boundary, then with the victim's own
    cache.stepped(0, "r", 1, 0, tokens_from(0, 4), "", pirate);
    cache.stepped(0, "r", 1, 4, tokens_from(4, 4), "", next);
    cache.stepped(1, "r", 1, 0, tokens_from(0, 4), "", victim);
    const std::string honest_1 = chain_digest("", victim), forged_1 = chain_digest("", pirate);
    const std::vector<std::string> honest{honest_1, chain_digest(honest_1, next)};
    const std::vector<std::string> forged{forged_1, chain_digest(forged_1, next)};
    auto found = cache.find("r", 1, tokens_from(0, 9), honest, {0, 1});
    CHECK_EQ(found.slot, 1); // the forged 8 are never a match for the honest chain
    CHECK_EQ(found.held, 4);
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 9), forged, {0, 1}).held, 8);
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 9), {}, {0, 1}).held, 0); // no chain, no match
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 9), {forged_1, honest[1]}, {0}).held, 4); // matching blocks only
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 9), {std::string(32, '\0')}, {0, 1}).held, 0);
    CHECK(cache.input_chain(0) == forged);
    cache.stepped(1, "r", 1, 4, tokens_from(4, 4)); // a block without its boundary's digest ends the prefix
    CHECK_EQ(cache.held(1), 4);
    cache.copied(0, 1, 4);
    CHECK(cache.input_chain(1) == std::vector<std::string>{forged_1});
}

TEST("a stage before the last holds a block once it sent it on, and names that chain on a hit") {
    prefix_cache cache(2, 4, false, prefix_cache::roles{false, true}); // the first of several
    const std::string out_1 = sha256_digest("sent 1"), out_2 = sha256_digest("sent 2");
    cache.stepped(0, "r", 1, 0, tokens_from(0, 4));
    CHECK_EQ(cache.held(0), 0); // not sent on yet: a hit could not name its chain
    cache.sent(0, 0, out_1);
    CHECK_EQ(cache.held(0), 4);
    cache.stepped(0, "r", 1, 4, tokens_from(4, 4));
    cache.sent(0, 8, out_2); // not the block just stepped: ignored
    CHECK_EQ(cache.held(0), 4);
    cache.sent(0, 4, out_2);
    CHECK_EQ(cache.held(0), 8);
    CHECK_EQ(cache.find("r", 1, tokens_from(0, 9), {}, {0}).held, 8); // the first stage needs no chain
    const std::string sent_1 = chain_digest("", out_1);
    CHECK(cache.output_chain(0, 8) == (std::vector<std::string>{sent_1, chain_digest(sent_1, out_2)}));
    cache.copied(0, 1, 4);
    CHECK(cache.output_chain(1, 4) == std::vector<std::string>{sent_1});
    cache.truncated(0, 5);
    CHECK(cache.output_chain(0, 8) == std::vector<std::string>{sent_1});
    CHECK_EQ(cache.held(0), 4);
}

static std::string hex(const std::string & bytes) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (const unsigned char byte : bytes) {
        out += digits[byte >> 4];
        out += digits[byte & 15];
    }
    return out;
}

TEST("a block's link is SHA-256 chained over its boundary bytes; what one costs a stage") {
    CHECK_EQ(hex(sha256_digest("abc")), std::string("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const std::string block = sha256_digest("a block's boundary");
    CHECK_EQ(chain_digest("", block), sha256_digest(block));
    CHECK_EQ(chain_digest(block, block), sha256_digest(block + block));
    // The cost per block: SmolLM2's default grid block (128 rows of 576 f32) and deepseek4
    // V4's (512 rows of 4 x 4096 f32); a stage after the first digests each block it
    // receives, a stage before the last each block it sends on (docs/architecture.md).
    for (const auto & [name, bytes] : {std::pair{"SmolLM2", size_t{128} * 576 * 4},
                                       std::pair{"deepseek4 V4", size_t{512} * 4 * 4096 * 4}}) {
        std::string rows(bytes, '\0');
        for (size_t i = 0; i < rows.size(); ++i) {
            rows[i] = static_cast<char>((i * 2654435761u) >> 13);
        }
        std::vector<double> micros;
        std::string link;
        for (int run = 0; run < 9; ++run) {
            const auto started = std::chrono::steady_clock::now();
            link = chain_digest(link, sha256_digest(rows));
            micros.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started).count());
        }
        std::sort(micros.begin(), micros.end());
        std::printf("  digest of a %s block (%.0f KiB): %.0f us median, %.2f GB/s\n", name,
                    static_cast<double>(bytes) / 1024.0, micros[micros.size() / 2],
                    static_cast<double>(bytes) / micros[micros.size() / 2] / 1e3);
        CHECK_EQ(link.size(), size_t{32});
    }
}

TEST("a copy holds the source's first positions only") {
    prefix_cache cache(2, 4);
    cache.stepped(0, "r", 1, 0, tokens_from(0, 4));
    cache.stepped(0, "r", 1, 4, tokens_from(4, 4));
    cache.copied(0, 1, 4);
    CHECK_EQ(cache.held(1), 4);
    cache.forget(0);
    CHECK_EQ(cache.held(0), 0);
    CHECK_EQ(cache.held(1), 4);
}

TEST("a kept entry gives its slot before any idle session is evicted") {
    session_store store(2, 0ms);
    const auto t = session_clock::now();
    const int32_t a = store.acquire(session_key{"r", 1, "a"}, {}, t).slot;
    store.acquire(session_key{"r", 1, "b"}, {}, t);
    CHECK_EQ(store.release(session_key{"r", 1, "a"}), a);
    store.keep(a, t);
    CHECK_EQ(store.entries(), 1);
    const auto c = store.acquire(session_key{"r", 1, "c"}, {}, t + 1ms);
    CHECK_EQ(c.slot, a);
    CHECK(c.took_entry && !c.evicted);
    CHECK_EQ(store.entries(), 0);
    CHECK(store.find(session_key{"r", 1, "b"}) >= 0);
}

TEST("a hit's new session takes another entry's slot before its source's") {
    session_store store(2, 0ms);
    const auto t = session_clock::now();
    for (const char * id : {"a", "b"}) {
        const int32_t slot = store.acquire(session_key{"r", 1, id}, {}, t).slot;
        store.release(session_key{"r", 1, id});
        store.keep(slot, id[0] == 'a' ? t : t + 1ms);
    }
    const int32_t source = store.entry_slots().front();
    const auto other = store.admit(session_key{"r", 1, "c"}, 4, {}, t + 2ms, source);
    CHECK(other.fresh && other.took_entry);
    CHECK(other.slot != source);
    const auto same = store.admit(session_key{"r", 1, "d"}, 4, {}, t + 2ms, source);
    CHECK_EQ(same.slot, source); // the last one: the hit takes its source over
    CHECK(store.admit(session_key{"r", 1, "e"}, 4, {}, t + 2ms).refused ==
          session_store::admission::refusal::cache_miss);
}

TEST("entries past the bound are dropped least recently used first") {
    session_store store(3, 0ms);
    const auto t = session_clock::now();
    std::vector<int32_t> slots;
    for (const char * id : {"a", "b", "c"}) {
        slots.push_back(store.acquire(session_key{"r", 1, id}, {}, t).slot);
    }
    for (size_t i = 0; i < slots.size(); ++i) {
        store.release(session_key{"r", 1, std::string(1, static_cast<char>('a' + i))});
        store.keep(slots[i], t + std::chrono::milliseconds(i));
    }
    const auto dropped = store.drop_entries(1);
    CHECK_EQ(dropped.size(), 2u);
    CHECK_EQ(dropped[0], slots[0]);
    CHECK_EQ(dropped[1], slots[1]);
    CHECK_EQ(store.entries(), 1);
}

TEST("whole only: an entry matches when all of it begins the asked tokens") {
    prefix_cache cache(3, 4, true);
    for (int32_t n_past = 0; n_past < 8; n_past += 4) {
        cache.stepped(0, "r", 1, n_past, tokens_from(n_past, 4));
    }
    cache.stepped(1, "r", 1, 0, tokens_from(0, 4));
    CHECK_EQ(cache.tokens(0), tokens_from(0, 8));
    auto found = cache.find("r", 1, tokens_from(0, 9), {}, {0, 1});
    CHECK_EQ(found.slot, 0);
    CHECK_EQ(found.held, 8);
    // 6 asked: the 8 of slot 0 cannot be cut to 4, slot 1's 4 are whole
    found = cache.find("r", 1, tokens_from(0, 6), {}, {0, 1});
    CHECK_EQ(found.slot, 1);
    CHECK_EQ(found.held, 4);
    std::vector<int32_t> asked = tokens_from(0, 12);
    asked[5] = 99; // differs inside slot 0's second block: its first is not reusable alone
    CHECK_EQ(cache.find("r", 1, asked, {}, {0}).held, 0);
    CHECK_EQ(cache.find("r", 1, asked, {}, {0, 1}).held, 4);
}

TEST("a snapshot takes a free slot below the bound, else the oldest entry not in the step") {
    session_store store(4, 0ms);
    const auto t = session_clock::now();
    const int32_t live = store.acquire(session_key{"r", 1, "live"}, {}, t).slot;
    const int32_t first = store.take_for_entry(2, {live});
    CHECK(first >= 0 && first != live);
    store.keep(first, t);
    const int32_t second = store.take_for_entry(2, {live});
    CHECK(second >= 0 && second != live && second != first);
    store.keep(second, t + 1ms);
    // at the bound: the least recently used entry's slot, unless this step copies from it
    CHECK_EQ(store.take_for_entry(2, {live, first}), second);
    store.keep(second, t + 2ms);
    CHECK_EQ(store.take_for_entry(2, {live}), first);
    CHECK_EQ(store.entries(), 1);
    store.keep(first, t + 3ms);
    CHECK_EQ(store.take_for_entry(2, {live, first, second}), -1); // never a live session's
    CHECK_EQ(store.find(session_key{"r", 1, "live"}), live);
    // a new session does not take an entry that the step copies from either
    const int32_t full = store.acquire(session_key{"r", 1, "full"}, {}, t).slot;
    const auto other = store.acquire(session_key{"r", 1, "other"}, {live, full, second}, t + 4ms);
    CHECK_EQ(other.slot, first); // second is the oldest, but busy
    CHECK(other.took_entry && !other.evicted);
}

TEST_MAIN()
