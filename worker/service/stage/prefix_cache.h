// prefix_cache.h - the token prefix each slot holds exactly as a cold run computes it, so
// that a new session may start from it: whole blocks of `block` tokens, each fed as one
// step at a multiple of `block` from position 0 (a cold run's prefill on the same grid
// computes those positions in the very same steps, so copying them gives the same bits).
// Which slots are kept as entries after their session's release is session_store's.
// With `whole_only` (a memory that copies whole sequences only, deepseek4) a slot is reused
// only as a whole: it matches when all of its exact prefix begins the asked tokens.
// Entries are kept apart by (route id, epoch) and by the tenant's cache salt: a session
// reuses only a prefix computed for its own salt, so no tenant learns what another sent.
// A stage after the first computes a block's KV from the boundary it was sent, not from
// the token ids, so there a block extends the prefix with the digest of that boundary
// chained on (prefix_digest.h), and a lookup matches only blocks whose chain equals the
// one the request names: an entry computed from another text's boundary under these ids
// is never served. A stage before the last keeps the chain of the boundary it sent on per
// block too: on a hit it names that chain to the next stage.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace meshnet {

// A step of `n_tokens` at `n_past` is one whole block at the grid (what a prefix grows by).
bool grid_block(int32_t block, int64_t n_past, int64_t n_tokens);

// Where the stage sits in its route: what the blocks' digest chains cover.
struct prefix_roles {
    bool checks_input = false;  // not the first stage: it computes from a boundary
    bool relays_output = false; // not the last stage: it sends a boundary on
};

class prefix_cache {
public:
    using roles = prefix_roles;

    // `block`: tokens per reusable block (0: the cache is off).
    prefix_cache(int32_t n_slots, int32_t block, bool whole_only = false, roles stage = {});

    int32_t block() const { return block_; }
    bool whole_only() const { return whole_only_; }

    // A step of `tokens` at `n_past` ran in `slot` for (route_id, epoch, salt): one whole
    // block at the grid position where the slot's exact prefix ends extends that prefix
    // (a step of another salt ends it). `input`: with checks_input, the SHA-256 of the
    // step's boundary bytes as received (without it the prefix ends).
    void stepped(int32_t slot, const std::string & route_id, uint64_t epoch, int64_t n_past,
                 const std::vector<int32_t> & tokens, const std::string & salt = "",
                 const std::string & input = "");
    // With relays_output: the block at `n_past` that `slot` just stepped sent on boundary
    // bytes whose SHA-256 is `output`. A block counts in the exact prefix only once this
    // is known (the next stage's hit needs it).
    void sent(int32_t slot, int64_t n_past, const std::string & output);
    // The slot dropped its positions >= `from`.
    void truncated(int32_t slot, int64_t from);
    // The slot was emptied.
    void forget(int32_t slot);
    // The slot now holds the first `n` positions of `source` (a hit).
    void copied(int32_t source, int32_t slot, int64_t n);
    // Tokens of the slot's exact prefix (a multiple of the block).
    int64_t held(int32_t slot) const;
    std::vector<int32_t> tokens(int32_t slot) const; // ... and their ids
    std::vector<std::string> input_chain(int32_t slot) const; // ... their input chain, a link per block
    // The chain of the boundary the slot sent on for its first `n` positions, a link per
    // block: what the next stage's lookup names on a hit.
    std::vector<std::string> output_chain(int32_t slot, int64_t n) const;

    struct match {
        int32_t slot = -1;
        int64_t held = 0; // a multiple of the block, <= tokens.size()
    };
    // The slot of (route_id, epoch, salt) among `candidates` whose exact prefix shares the
    // most whole blocks with `tokens`, compared token by token (never by hash alone), and,
    // with checks_input, whose input chain begins with `chain` for those blocks (a block
    // computed from another boundary is not a match); whole only: the longest exact prefix
    // that `tokens` begin with, all of it.
    match find(const std::string & route_id, uint64_t epoch, const std::vector<int32_t> & tokens,
               const std::vector<std::string> & chain, const std::vector<int32_t> & candidates,
               const std::string & salt = "") const;

private:
    struct slot_prefix {
        std::string              route_id;
        uint64_t                 epoch = 0;
        std::string              salt;   // the tenant's, "" for none
        std::vector<int32_t>     tokens; // the exact prefix
        std::vector<std::string> input;  // checks_input: a chain link per block of tokens
        std::vector<std::string> output; // relays_output: a link per block sent on (<= blocks)
    };
    int64_t usable(const slot_prefix & prefix) const; // tokens of the exact prefix
    slot_prefix prefix_of(const slot_prefix & prefix, int64_t n) const; // its first n positions

    int32_t                  block_;
    bool                     whole_only_;
    roles                    roles_;
    mutable std::mutex       mutex_;
    std::vector<slot_prefix> slots_;
};

} // namespace meshnet
