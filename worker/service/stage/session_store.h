// session_store.h - (route_id, epoch, session_id) -> engine slot: bounded slots, LRU
// eviction of idle sessions, the slot each session's KV lives in, and the released slots
// kept as prefix cache entries (prefix_cache says what they hold).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace meshnet {

struct session_key {
    std::string route_id;
    uint64_t    epoch = 0;
    std::string session_id;

    bool operator<(const session_key & other) const {
        return std::tie(route_id, epoch, session_id) < std::tie(other.route_id, other.epoch, other.session_id);
    }
    bool operator==(const session_key & other) const {
        return route_id == other.route_id && epoch == other.epoch && session_id == other.session_id;
    }
};

using session_clock = std::chrono::steady_clock;

class session_store {
public:
    // `evict_idle` is the grace a session keeps its slot after its last step before a
    // new session may evict it.
    session_store(int32_t n_slots, session_clock::duration evict_idle);

    struct acquire_result {
        int32_t     slot    = -1;    // -1: no slot (capacity exhausted)
        bool        created = false; // the session was new
        bool        evicted = false; // `evicted_key` lost its slot to make room
        session_key evicted_key;
        bool        took_entry = false; // the slot was a kept entry's (gone as one now)
    };

    // The session's slot, or -1 when it holds none.
    int32_t find(const session_key & key) const;

    // The session's slot, allocating one for a new session: a free slot not in `busy`, else the
    // least-recently-used kept entry not in `busy` (`spare` last of them), else the
    // least-recently-used session that is idle past the grace and not in `busy`. A kept
    // entry never holds a slot a live session needs; a live session is never evicted for
    // an entry.
    acquire_result acquire(const session_key & key, const std::vector<int32_t> & busy,
                           session_clock::time_point now, int32_t spare = -1);

    // Whether a step of the session that builds on `n_past` positions may run, and in
    // which slot: the session's own, or one taken as acquire() takes it for n_past 0 or,
    // with a `prefix_source` slot that holds those positions, to copy them from it.
    struct admission {
        enum class refusal {
            none,
            cache_miss,        // n_past > 0 and the session holds no slot here
            capacity_exhausted // no slot free or evictable
        };
        int32_t slot    = -1;
        bool    fresh   = false; // just taken for the session: the caller clears its KV
        bool    took_entry = false; // fresh: the slot was a kept entry's
        refusal refused = refusal::none;
    };
    admission admit(const session_key & key, int64_t n_past, const std::vector<int32_t> & busy,
                    session_clock::time_point now, int32_t prefix_source = -1);

    // A released session's slot stays as a prefix cache entry (its KV untouched) until
    // acquire() takes it or drop_entries() drops it.
    void keep(int32_t slot, session_clock::time_point now);
    // A slot for a new entry (a snapshot) while at most `most` are kept: a free slot while
    // fewer are, else the least recently used entry's not in `busy` (no longer an entry:
    // the caller clears it and keeps it again), else -1. Never a live session's.
    int32_t take_for_entry(size_t most, const std::vector<int32_t> & busy);
    // The entry in `slot` is no longer one (its slot is free; the caller clears it).
    void drop_entry(int32_t slot);
    // A hit used the entry in `slot`: it is the most recently used.
    void touch_entry(int32_t slot, session_clock::time_point now);
    // Drops the least recently used entries past `most`; returns their slots (now free,
    // the caller clears them).
    std::vector<int32_t> drop_entries(size_t most);
    int32_t entries() const;
    std::vector<int32_t> entry_slots() const;

    // Marks a step of the session done at `now` (LRU order).
    void touch(const session_key & key, session_clock::time_point now);

    // Forgets the session; returns its slot, or -1 when it held none.
    int32_t release(const session_key & key);

    int32_t n_slots() const { return static_cast<int32_t>(slot_owner_.size()); }
    int32_t slots_free() const;
    int32_t active() const;
    // Sessions whose last step ended within `window` before `now`.
    int32_t recently_used(session_clock::time_point now, session_clock::duration window) const;

private:
    acquire_result acquire_locked(const session_key & key, const std::vector<int32_t> & busy,
                                  session_clock::time_point now, int32_t spare); // the caller holds mutex_
    int32_t oldest_entry_locked(int32_t spare, const std::vector<int32_t> & busy = {}) const; // -1 when none
    // a slot no session holds, not an entry, not in `busy` (a copy may still land there)
    int32_t free_slot_locked(const std::vector<int32_t> & busy) const; // -1 when none

    struct entry {
        int32_t                   slot;
        session_clock::time_point last_used;
    };

    mutable std::mutex                 mutex_;
    session_clock::duration            evict_idle_;
    std::map<session_key, entry>       sessions_;
    std::vector<const session_key *>   slot_owner_; // null: free or a kept entry
    std::map<int32_t, session_clock::time_point> kept_; // entry slot -> last used
};

} // namespace meshnet
