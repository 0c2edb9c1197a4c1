// rollback_depth.h - how far back each slot of a deepseek4 stage can drop positions right now.
// Its memory keeps `depth` snapshots of the compressed state per slot; a discard restores one
// at the next step. Only what the steps since the last discard wrote is there, and a second
// discard before a step would have to compose two restores, which the memory cannot: such
// discards are refused instead of computing on a state plain decoding never produces. This
// mirrors the memory's own rule (patch 0010), so a refusal can say how deep it could go.
#pragma once

#include <cstdint>
#include <vector>

namespace meshnet {

class rollback_depth {
public:
    rollback_depth(int32_t n_slots, int32_t depth);

    // the most positions `slot` could drop now (0 while a discard waits for its step)
    int32_t restorable(int32_t slot) const;

    // whether dropping the slot's last `n` positions (n >= 1) can be undone exactly
    bool can_drop(int32_t slot, int32_t n) const;

    void dropped(int32_t slot, int32_t n); // a discard of n positions was applied
    void stepped(int32_t slot, int32_t n); // a step of n rows ran (a pending restore with it)
    void cleared(int32_t slot);            // the slot is empty: nothing to restore

private:
    struct slot_state {
        int32_t restorable = 0;
        bool    pending    = false;
    };

    int32_t                 depth_;
    std::vector<slot_state> slots_;
};

} // namespace meshnet
