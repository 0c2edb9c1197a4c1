// batch_picker.h - which queued steps run together as one engine step (pure, no locks).
#pragma once

#include "session_store.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshnet {

struct queued_step {
    session_key key;
    int64_t     n_tokens = 0;
};

struct batch_limits {
    int64_t max_tokens = 512;       // tokens in one engine step (the first step always fits)
    size_t  max_steps  = SIZE_MAX;  // steps in one engine step (pipeline groups)
    // Batch invariance: > 0 keeps every row's result what it would be alone. A multi-token
    // step (a prefill) runs alone, and at most this many single-token steps share one
    // engine step (on the CPU lane: the widths whose kernels compute each column exactly as
    // alone, patches 0006-0008). 0: steps of any size mix, and rows may differ from their
    // solo result in their last bits (the kernels of wider products sum in another order).
    size_t  exact_rows = 0;
};

// Indices into `queue` (arrival order) of the steps of the next engine step: the oldest
// step, then later ones in order as the limits allow, at most one per session.
std::vector<size_t> pick_batch(const std::vector<queued_step> & queue, const batch_limits & limits);

} // namespace meshnet
