// slot_memory.h - what a failed step may leave in a session slot's memory, and undoing it.
#pragma once

#include "llama.h"

#include <cstdint>

namespace meshnet {

// Drops positions [pos0, ...) of `slot` after a failed step. A memory that cannot drop them
// (deepseek4 keeps the compressor state a committed position wrote) has the whole slot
// cleared instead, so that nothing stale is ever computed on. False: the slot was cleared.
bool slot_rollback(llama_memory_t memory, int32_t slot, int32_t pos0);

} // namespace meshnet
