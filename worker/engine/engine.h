// engine.h - the contract between the shard service and a model backend that owns
// one contiguous layer range [begin, end) of a GGUF model.
#pragma once

#include "drafter_kind.h"
#include "layer_range.h"
#include "special_split.h"
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshnet {

// Failures are status values, never exceptions across this interface.
enum class engine_status {
    ok,
    invalid_argument,    // malformed input (shape, positions, token ids, NaN policy)
    cache_miss,          // the slot does not hold the positions the step builds on
    capacity_exhausted,  // no free slot / KV cells for this step
    context_overflow,    // positions would exceed the context length
    internal,            // the backend failed; the slot's state is unknown and was cleared
};

// Inline so code that only sees this header (the service, fake-engine tests) can name
// statuses without linking an engine.
inline const char * engine_status_name(engine_status status) {
    switch (status) {
        case engine_status::ok:                 return "ok";
        case engine_status::invalid_argument:   return "invalid_argument";
        case engine_status::cache_miss:         return "cache_miss";
        case engine_status::capacity_exhausted: return "capacity_exhausted";
        case engine_status::context_overflow:   return "context_overflow";
        case engine_status::internal:           return "internal";
    }
    return "unknown";
}

// Shape of the residual stream crossing a layer boundary.
enum class boundary_schema {
    dense_residual,  // [n_tokens, n_embd]
    mhc_residual,    // [n_tokens, hc_mult, n_embd] (deepseek4)
};

struct engine_params {
    std::string model_path;
    layer_range layers{0, layer_range::to_n_layer}; // the owned layers (open end: to n_layer)
    int32_t     n_ctx        = 4096; // per slot
    int32_t     n_slots      = 4;    // concurrent sequences
    int32_t     n_batch      = 512;  // max tokens in one step
    int32_t     n_threads    = 0;    // 0: hardware concurrency
    int32_t     n_gpu_layers = 0;
    int32_t     discard_depth = 0;   // deepseek4: compressor-state snapshots per slot, the most
                                     // positions one discard may drop; 0: it cannot discard
    drafter_kind drafter = drafter_kind::none; // last stage only; dspark: the GGUF of drafter_model
    std::string drafter_model;       // dspark: the drafter's GGUF
    int32_t     drafter_k    = 3;    // tokens the drafter proposes per window
};

// A drafter the stage hosts (GetInfo drafter), as it reports itself: kind none when none.
struct drafter_facts {
    drafter_kind         kind         = drafter_kind::none;
    int32_t              max_drafts   = 0;
    size_t               weight_bytes = 0; // its weights on this stage
    size_t               state_bytes  = 0; // its state, all slots
    std::vector<int32_t> target_layers;    // the main layers whose outputs it reads
    int32_t              n_vocab      = 0;
};

struct engine_info {
    std::string     arch;
    int32_t         n_layer      = 0;
    layer_range     layers;              // the layers it owns, [begin, end)
    int32_t         n_embd       = 0;
    int32_t         n_vocab      = 0;
    bool            has_vocab    = false; // can tokenize / detokenize
    bool            needs_token_sideband = false; // non-first stages also need token ids
    boundary_schema schema       = boundary_schema::dense_residual;
    int64_t         boundary_row = 0;    // floats per token in a boundary row
    int32_t         n_ctx        = 0;    // per slot
    int32_t         n_slots      = 0;
    size_t          weight_bytes = 0;    // bytes of weights actually allocated
    size_t          kv_bytes     = 0;    // bytes of KV/state actually allocated
    bool            can_discard  = false; // slot_discard can drop a suffix of a slot's positions
    int32_t         discard_depth = 0;    // with can_discard: the most positions one discard may
                                          // drop (fewer where recent steps hold fewer); 0: any
    size_t          discard_bytes = 0;    // memory the snapshots behind discard_depth cost per slot
    drafter_facts   drafter;              // last stage: the drafter it hosts (kind none when none)
    bool            can_copy_prefix = false; // slot_copy_prefix works (prefix cache)
    bool            copies_whole_only = false; // with can_copy_prefix: only a source's whole
                                               // sequence (deepseek4: no suffix can be dropped)

    bool is_first() const { return layers.begin == 0; }
    bool is_last()  const { return layers.end == n_layer; }
};

// One session's part of a step. The first stage takes `tokens`; later stages take
// `boundary` (n_tokens x boundary_row floats, f32) and, when the architecture needs
// it, `tokens` as a sideband. Positions continue the slot's sequence.
struct step_request {
    int32_t              slot = 0;
    std::vector<int32_t> positions;
    std::vector<int32_t> tokens;
    std::vector<float>   boundary;
    std::vector<int32_t> output_rows; // last stage: rows whose logits are wanted
};

// What slot_discard did. A refusal leaves the slot untouched.
enum class discard_status {
    done,         // the positions are dropped (or the slot held none of them)
    unsupported,  // the memory cannot drop a suffix (info().can_discard is false)
    too_deep,     // more positions than the slot can restore now, or a second discard
                  // before a step ran (deepseek4's snapshots)
};

struct discard_result {
    discard_status status     = discard_status::done;
    int32_t        restorable = 0; // too_deep: the most positions the slot could drop now
};

// A non-last stage returns the residual leaving its last layer for every row; the
// last stage returns logits (output_rows.size() x n_vocab).
struct step_result {
    engine_status      status = engine_status::ok;
    std::string        message;
    std::vector<float> boundary;
    std::vector<float> logits;
};

struct engine_i {
    virtual ~engine_i() = default;

    // what this engine serves: identities, range, boundary schema, footprint
    virtual const engine_info & info() const = 0;

    // run one step for several sessions at once (batched into one decode where the
    // backend can); results[i] answers requests[i]; one request's failure leaves the
    // other sessions' state untouched
    virtual std::vector<step_result> step(const std::vector<step_request> & requests) = 0;

    // number of positions the slot holds (0 when empty)
    virtual int32_t slot_n_past(int32_t slot) const = 0;

    // forget everything the slot holds
    virtual void slot_clear(int32_t slot) = 0;

    // drop the slot's positions >= `from` (speculative decoding's rejected drafts); a
    // refusal says why and leaves the slot untouched
    virtual discard_result slot_discard(int32_t /*slot*/, int32_t /*from*/) {
        return {discard_status::unsupported, 0};
    }

    // prefix cache: `slot` holds the first `n` positions of `source` and nothing more (the
    // same slot: it keeps its first `n`); false where the memory cannot (can_copy_prefix;
    // with copies_whole_only, an `n` other than all of the source's positions), and `slot`
    // is then empty
    virtual bool slot_copy_prefix(int32_t /*source*/, int32_t slot, int32_t /*n*/) {
        slot_clear(slot);
        return false;
    }

    // last stage with a drafter: up to `most` (and drafter.max_drafts) tokens proposed to
    // follow `token`, sampled for position `pos` of the slot, which keeps positions < pos
    // (what it holds from pos on are rejected drafts); empty without a drafter or when it
    // cannot draft there. Drafts only propose: verification decides what is kept.
    virtual std::vector<int32_t> draft(int32_t /*slot*/, int32_t /*pos*/, int32_t /*token*/, int32_t /*most*/) {
        return {};
    }

    // KV cells in use / total, summed over slots
    virtual int64_t kv_used() const = 0;
    virtual int64_t kv_total() const = 0;

    // text <-> token ids; invalid_argument when the stage has no vocabulary. Special tokens
    // are parsed as the vocabulary defines them, except that none is made from text inside
    // the `literal` ranges (sorted, non-overlapping; invalid_argument otherwise).
    virtual engine_status tokenize(const std::string & text, bool add_special, const std::vector<text_range> & literal,
                                   std::vector<int32_t> & out) const = 0;
    virtual engine_status detokenize(const std::vector<int32_t> & tokens, std::string & out) const = 0;
};

using engine_ptr = std::unique_ptr<engine_i>;

// Loads the range with the patched llama.cpp; on failure returns null and sets `error`.
engine_ptr llama_engine_init(const engine_params & params, std::string & error);

} // namespace meshnet
