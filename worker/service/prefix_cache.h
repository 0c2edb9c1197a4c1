// prefix_cache.h - the token prefix each slot holds exactly as a cold run computes it, so
// that a new session may start from it: whole blocks of `block` tokens, each fed as one
// step at a multiple of `block` from position 0 (a cold run's prefill on the same grid
// computes those positions in the very same steps, so copying them gives the same bits).
// Which slots are kept as entries after their session's release is session_store's.
// With `whole_only` (a memory that copies whole sequences only, deepseek4) a slot is reused
// only as a whole: it matches when all of its exact prefix begins the asked tokens.
// Entries are kept apart by (route id, epoch) and by the tenant's cache salt: a session
// reuses only a prefix computed for its own salt, so no tenant learns what another sent.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace meshnet {

class prefix_cache {
public:
    // `block`: tokens per reusable block (0: the cache is off).
    prefix_cache(int32_t n_slots, int32_t block, bool whole_only = false);

    int32_t block() const { return block_; }
    bool whole_only() const { return whole_only_; }

    // A step of `tokens` at `n_past` ran in `slot` for (route_id, epoch, salt): one whole
    // block at the grid position where the slot's exact prefix ends extends that prefix
    // (a step of another salt ends it).
    void stepped(int32_t slot, const std::string & route_id, uint64_t epoch, int64_t n_past,
                 const std::vector<int32_t> & tokens, const std::string & salt = "");
    // The slot dropped its positions >= `from`.
    void truncated(int32_t slot, int64_t from);
    // The slot was emptied.
    void forget(int32_t slot);
    // The slot now holds the first `n` positions of `source` (a hit).
    void copied(int32_t source, int32_t slot, int64_t n);
    // Tokens of the slot's exact prefix (a multiple of the block).
    int64_t held(int32_t slot) const;
    std::vector<int32_t> tokens(int32_t slot) const; // ... and their ids

    struct match {
        int32_t slot = -1;
        int64_t held = 0; // a multiple of the block, <= tokens.size()
    };
    // The slot of (route_id, epoch, salt) among `candidates` whose exact prefix shares the
    // most whole blocks with `tokens`, compared token by token (never by hash alone); whole
    // only: the longest exact prefix that `tokens` begin with, all of it.
    match find(const std::string & route_id, uint64_t epoch, const std::vector<int32_t> & tokens,
               const std::vector<int32_t> & candidates, const std::string & salt = "") const;

private:
    struct slot_prefix {
        std::string          route_id;
        uint64_t             epoch = 0;
        std::string          salt;   // the tenant's, "" for none
        std::vector<int32_t> tokens; // the exact prefix
    };

    int32_t                  block_;
    bool                     whole_only_;
    mutable std::mutex       mutex_;
    std::vector<slot_prefix> slots_;
};

} // namespace meshnet
