// rollback_depth.cpp - see rollback_depth.h.
#include "rollback_depth.h"

#include <algorithm>

namespace meshnet {

rollback_depth::rollback_depth(int32_t n_slots, int32_t depth)
    : depth_(depth), slots_(static_cast<size_t>(std::max(n_slots, 0))) {}

int32_t rollback_depth::restorable(int32_t slot) const {
    const slot_state & state = slots_.at(static_cast<size_t>(slot));
    return state.pending ? 0 : state.restorable;
}

bool rollback_depth::can_drop(int32_t slot, int32_t n) const {
    return n >= 1 && n <= restorable(slot);
}

void rollback_depth::dropped(int32_t slot, int32_t n) {
    slot_state & state = slots_.at(static_cast<size_t>(slot));
    state.restorable -= n;
    state.pending = true;
}

void rollback_depth::stepped(int32_t slot, int32_t n) {
    // each row leaves one more snapshot behind it, the oldest beyond `depth` overwritten
    slot_state & state = slots_.at(static_cast<size_t>(slot));
    state.restorable = std::min(depth_, state.restorable + n);
    state.pending = false;
}

void rollback_depth::cleared(int32_t slot) {
    slots_.at(static_cast<size_t>(slot)) = slot_state{};
}

} // namespace meshnet
