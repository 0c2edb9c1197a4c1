// exactness_probe.h - what this stage's kernels compute exactly, measured at start on its
// own weights and device (docs/architecture.md, "Exactness on every lane"): the widest step
// whose rows are bit-identical to one-row steps (step invariance: speculation's verify
// windows rely on it), and whether one-row steps of different sessions sharing an engine
// step compute as alone (batch invariance: a session's tokens do not depend on load).
// Nothing is assumed from the lane's name: GPU kernels pick code paths by row count.
#pragma once

#include "engine.h"

#include <cstdint>
#include <string>

namespace meshnet {

// The widest step a probe tries: the CPU lane's batch-invariant width (patches 0006-0008),
// a verify window of 7 drafts and the token.
constexpr int32_t max_exact_step_rows = 8;

struct exactness {
    int32_t     step_rows = 0;     // every step of 1..step_rows rows gives one-row steps' bits (0: none claimed)
    bool        batching  = false; // sessions' one-row steps in one engine step compute as alone
    std::string detail;            // what was measured, or why nothing was
    int64_t     probe_micros = 0;  // what measuring took
};

// Runs the probe on `engine` before it serves (it must hold no session: the probe uses its
// slots and clears them): widths up to `max_rows` (--exact-batch-rows; 0: nothing claimed,
// nothing run), each no wider than `max_step_tokens`. Leaves every slot empty.
exactness measure_exactness(engine_i & engine, int32_t max_rows, int32_t max_step_tokens);

} // namespace meshnet
