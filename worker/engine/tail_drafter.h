// tail_drafter.h - what a drafter hosted on the last stage of a route does for the engine: it
// sees the rows of every step the main context decodes, and after a token is sampled it
// proposes the next window's tokens. The model's own MTP layers (mtp_drafter) and a DSpark
// drafter GGUF (dspark_drafter) are the two kinds.
#pragma once

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshnet {

// One session's rows of a decode the main context ran.
struct drafter_step {
    int32_t                      slot = 0;
    int32_t                      pos0 = 0;
    const std::vector<int32_t> * tokens = nullptr; // one per row (a later stage: its sideband, maybe none)
    int32_t                      first_index = 0;  // the rows' first entry in the main batch
    int32_t                      n_rows = 0;
};

class tail_drafter {
public:
    virtual ~tail_drafter() = default;

    // After the main context decoded `steps`: take what the drafter reads of their rows. A
    // failure forgets those slots' drafter state: they draft nothing until their next step.
    virtual void stepped(const std::vector<drafter_step> & steps) = 0;

    // Up to `most` (and max_drafts) tokens to follow `token`, sampled for position `pos` of
    // the slot (the slot keeps positions < pos; the drafter forgets what it held from pos
    // on). Empty when what it needs of the slot is unknown or there is no room.
    virtual std::vector<int32_t> draft(int32_t slot, int32_t pos, int32_t token, int32_t most) = 0;

    // The slot's positions >= from are gone (a discard), or all of them (a clear).
    virtual void discard(int32_t slot, int32_t from) = 0;
    virtual void clear(int32_t slot) = 0;

    virtual int32_t max_drafts() const = 0;
    // bytes of its state on this stage, all slots
    virtual size_t state_bytes() const = 0;

protected:
    // Decodes the drafter's batch; on failure its slots' state is unknown, so it is forgotten.
    bool decode_or_clear(llama_context * ctx, llama_batch_ext * batch, const std::vector<int32_t> & slots) {
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) == 0) {
            return true;
        }
        for (int32_t slot : slots) {
            clear(slot);
        }
        return false;
    }
};

} // namespace meshnet
