// slot_memory.cpp - see slot_memory.h.
#include "slot_memory.h"

namespace meshnet {

bool slot_rollback(llama_memory_t memory, int32_t slot, int32_t pos0, int32_t rc, bool drops_any_suffix) {
    if (rc == 1 || rc == -1) {
        return true;
    }
    if (drops_any_suffix && llama_memory_seq_rm(memory, slot, pos0, -1)) {
        return true;
    }
    llama_memory_seq_rm(memory, slot, -1, -1);
    return false;
}

} // namespace meshnet
