// discard_bytes.h - what deepseek4's rollback snapshots cost per slot: the memory of a
// one-slot context with `depth` snapshots less that of one without, measured, so it stays
// true to what the pinned memory allocates (the snapshots do not depend on the context
// length, so the probe contexts are small).
#pragma once

#include "llama.h"

#include <cstddef>
#include <cstdint>

namespace meshnet {

// 0 when either probe context cannot be made; `cparams` as for the stage's own context.
size_t discard_bytes_per_slot(llama_model * model, llama_context_params cparams, uint32_t depth);

} // namespace meshnet
