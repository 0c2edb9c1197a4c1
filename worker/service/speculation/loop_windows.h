// loop_windows.h - a ForwardStream's decode loops on the stream's side (pure, no transport):
// a loop's limits and first window from the caller's step, each next window as the step to
// queue, and the order the stream writes answers in (a dropped window's never).
#pragma once

#include "loop_pipeline.h"

#include "meshnet/shard/v1/shard_service.pb.h"

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace meshnet {

namespace pb = ::meshnet::shard::v1;

// What bounds a decode loop on this stage, whatever its caller asks.
struct loop_stage_limits {
    int32_t max_drafts  = 7;  // --max-loop-drafts
    int32_t max_windows = 8;  // --max-loop-windows
    int32_t exact_rows  = 0;  // the widest step this stage measured exact (GetInfo exact_step_rows)
    int64_t n_ctx       = 0;
    int64_t discard_depth = 0;
};

// The caller's asks (loop_drafts, loop_windows) within the stage's: a verify window (drafts
// + 1 rows) only as wide as this stage measured exact; the driver asks for no wider one
// where any stage measured less.
loop_limits loop_limits_for(const pb::ForwardRequest & request, const loop_stage_limits & stage);

// One decode loop: the pipeline of its windows and the caller's step they are copies of.
class decode_loop {
public:
    // `request`, the caller's step with continue_tokens, becomes the loop's first window
    // (`first_id`): its draft context moves into the pipeline's drafter, and it asks the last
    // stage for the drafts of the next window (none in a plain loop: it does not pay for them).
    decode_loop(pb::ForwardRequest & request, const loop_limits & limits, uint64_t first_id);

    // The next window's step while the pipeline has room for one, in the pipeline's order.
    std::optional<pb::ForwardRequest> next();

    // Window `window` answered `tokens` and the last stage's `next_drafts`: each window the
    // answer resolved, true for one of the loop's text, false for one it dropped.
    std::vector<std::pair<uint64_t, bool>> answered(uint64_t window, std::vector<int32_t> tokens,
                                                    std::vector<int32_t> next_drafts);

    size_t in_flight() const { return pipeline_.in_flight(); }

private:
    loop_pipeline      pipeline_;
    pb::ForwardRequest base_; // the first window's step: every later one is a copy
};

// The order a stream writes its answers in: each step's once every earlier step's has gone;
// a loop window's once its loop has said whether it is the loop's text, and a dropped
// window's never. A step outside a loop is always written.
class answer_order {
public:
    // A step was queued: its place in the order. `window`: its loop window (0: none).
    uint64_t queued(uint64_t window);
    // The loop's verdict on `window`, if its answer was not written yet; the first one stands.
    void decide(uint64_t window, bool text);
    // The step at `seq` is a window its loop dropped: void whatever its answer.
    bool dropped(uint64_t seq) const;
    // The step at `seq` has its answer.
    void answered(uint64_t seq);
    // The steps whose turn has come, in order, each with whether its answer is written;
    // they leave the order.
    std::vector<std::pair<uint64_t, bool>> due();

private:
    struct step {
        uint64_t            window = 0;
        std::optional<bool> text;     // known once its loop resolved it (always, outside a loop)
        bool                answered = false;
    };
    std::map<uint64_t, step>     steps_;   // by seq, not written yet
    std::map<uint64_t, uint64_t> windows_; // window -> seq, not written yet
    uint64_t                     next_seq_   = 0;
    uint64_t                     next_write_ = 0;
};

} // namespace meshnet
