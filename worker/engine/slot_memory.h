// slot_memory.h - what a failed step may leave in a session slot's memory, and undoing it.
#pragma once

#include "llama.h"

#include <cstdint>

namespace meshnet {

// After a decode that failed with llama_process's `rc`, brings `slot` back to its positions
// before `pos0`. Codes 1 and -1 fail before the memory is touched: the slot is kept as it
// is. After any other failure a memory that can drop any suffix (`drops_any_suffix`, an
// attention KV cache) drops the step's positions; one that cannot (deepseek4: the failed
// graph may have written part of its compressor state and snapshots, or consumed a pending
// restore) has the whole slot cleared, so that nothing stale is ever computed on.
// False: the slot was cleared.
bool slot_rollback(llama_memory_t memory, int32_t slot, int32_t pos0, int32_t rc, bool drops_any_suffix);

} // namespace meshnet
