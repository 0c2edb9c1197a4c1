// prefix_slots.h - the prefix cache's slots, on the engine thread: released sessions' slots
// kept as entries, a new session's copy from one (a hit), whole-only snapshots, and the
// copies in flight. prefix_cache.h says what each slot holds, session_store.h which slots
// are entries. A memory that copies whole sequences only (deepseek4) lands a copy at the
// next decode, so until a decode has run the slots such copies write are no one's: a batch
// whose decode did not run drops the entries and sessions they were for and holds their
// slots out of use (settling). Off until configured: no entries, every lookup a miss.
#pragma once

#include "engine.h"
#include "error_info.h"
#include "prefix_cache.h"
#include "session_store.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace meshnet {

struct prefix_counts {
    int64_t lookups = 0;       // new sessions that asked to start from a prefix
    int64_t hits = 0;          // ... and did
    int64_t reused_tokens = 0; // positions copied instead of computed
    int64_t entries = 0;       // kept slots
    int64_t entry_tokens = 0;  // positions they hold
    int64_t snapshots_skipped = 0; // snapshots asked for with no slot to spare
};

// What a new session's step asks to start from: its positions 0..n_past-1.
struct prefix_ask {
    const session_key &              key;
    int64_t                          n_past;
    const std::vector<int32_t> &     tokens;
    const std::vector<std::string> & chain; // the previous stage's output chain for them
    const std::string &              salt;  // the tenant's: prefixes are reused only within one salt
};

class prefix_slots {
public:
    prefix_slots(engine_i & engine, session_store & sessions) : engine_(engine), sessions_(sessions) {}

    // Whole blocks of `block` tokens, up to `max_entries` released sessions' slots kept.
    // Stays off (0) on an engine that cannot copy a prefix. Before the engine thread starts.
    void configure(int32_t block, int32_t max_entries);
    int32_t block() const { return cache_ ? cache_->block() : 0; }
    bool whole_only() const { return cache_ && cache_->whole_only(); }
    prefix_counts stats() const; // any thread

    // The rest on the engine thread.

    // The slot's KV is cleared and its prefix forgotten.
    void clear(int32_t slot);
    // Forgets the session and clears its slot, or keeps the slot as an entry when it holds
    // an exact prefix (not on a whole-only memory: its entries are snapshots). Returns
    // whether the session held a slot.
    bool release(const session_key & key);
    // Slots a copy queued by an earlier batch may still write: no session may take or
    // clear them (a batch's `busy` starts with them).
    const std::vector<int32_t> & unsettled() const { return unsettled_; }

    // The slot to copy a new session's prefix from, or -1 with the refusal in `error`
    // (CACHE_MISS with `prefix_held`).
    int32_t source(const prefix_ask & ask, std::optional<shard_error> & error);
    // A hit: the session's fresh `slot` gets the first `n_past` positions of `source`;
    // `chain` is what the next stage's lookup must name. On a whole-only memory the copy
    // lands at this batch's decode: `source` joins `busy` until then. False when the
    // engine could not copy.
    bool copy(int32_t source, int32_t slot, const session_key & key, int64_t n_past, std::vector<int32_t> & busy,
              session_clock::time_point now, std::vector<std::string> & chain);
    // Whole-only (else nothing): keeps the whole sequence that the session's `slot` holds
    // before its step (`n_past` positions) as an entry, in a slot no live session needs and
    // none of `busy` (which it joins: the copy lands at this batch's decode).
    void snapshot(int32_t slot, const session_key & key, int64_t n_past, const std::string & salt,
                  std::vector<int32_t> & busy, session_clock::time_point now);

    // The step (prefix_cache::truncated, stepped, sent).
    void truncated(int32_t slot, int64_t from);
    void stepped(int32_t slot, const session_key & key, int64_t n_past, const std::vector<int32_t> & tokens,
                 const std::string & salt, const std::string & input);
    void sent(int32_t slot, int64_t n_past, const std::string & digest);

    // After the batch's engine step: `decoded` (some decode ran, so every queued copy
    // landed) frees the slots held out so far; otherwise this batch's copies are held out.
    void settle(bool decoded);

private:
    engine_i &                    engine_;
    session_store &               sessions_;
    std::unique_ptr<prefix_cache> cache_;
    size_t                        max_entries_ = 0;
    std::atomic<int64_t>          lookups_{0};
    std::atomic<int64_t>          hits_{0};
    std::atomic<int64_t>          reused_{0};
    std::atomic<int64_t>          snapshots_skipped_{0};
    // whole-sequence copies this batch queued: the slot each writes and the session
    // holding it (an entry's: none)
    std::vector<std::pair<int32_t, session_key>> copied_;
    std::vector<int32_t>          unsettled_; // slots a queued whole-sequence copy may still write
};

} // namespace meshnet
