// loop_pipeline.h - the windows of a first stage's decode loop (pure, no transport): which
// step to submit next, and what an answer means for the steps still in flight.
//
// A window is one step [first, drafts...] at consecutive positions, verified at the last
// stage (one sampled token when it has no drafts). Serially, the next window starts with
// the token its predecessor answered last. Pipelined (ForwardRequest.loop_windows > 1),
// up to `depth` windows are in flight: each later one is drafted on the assumption that
// every window before it is accepted whole, so its first token is a draft of the token
// its predecessor will answer last. An answer that confirms the whole window, and the
// next window's first token, lets the pipeline run on; any other answer drops every later
// window (their answers are ignored) and the next window starts from the answered token,
// discarding on every stage what the dropped windows left there. The depth adapts: one
// more window after each window accepted whole, back to one at a rejection, and one while
// the drafts fail too often for pipelining to pay.
#pragma once

#include "loop_drafts.h"

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <vector>

namespace meshnet {

// Windows in flight at most (ForwardRequest.loop_windows is capped here too).
constexpr uint32_t max_loop_windows = 8;

struct loop_limits {
    int     drafts  = 0;        // tokens drafted per window at most (0: a plain loop)
    int     windows = 1;        // windows in flight at most (1: serial)
    int64_t n_ctx   = 0;        // positions a session may hold
    int64_t discard_depth = 0;  // positions one discard may drop (0: any)
};

struct loop_window {
    uint64_t             id = 0;
    int64_t              n_past = 0;        // position of its first token
    std::vector<int32_t> tokens;            // first token, then its drafts
    int64_t              discard_from = -1; // >= 0: drop positions from here first
    bool                 verify = false;    // verified (accepted drafts + one), else one sample
};

// What one answered window means for the stream.
struct loop_answer {
    bool                  answer = false;  // a window of the loop's text: send its answer
    bool                  done   = false;  // the loop has no further window to run
    std::vector<uint64_t> dropped;         // windows in flight whose answers are now void
};

class loop_pipeline {
public:
    // The loop's first window is the caller's own step (`first`), fed after `context` (the
    // tokens before it); `wanted`: tokens the loop answers at most, the first step's
    // included; `stops`: the loop ends after answering one of these.
    loop_pipeline(loop_limits limits, const std::vector<int32_t> & context, loop_window first, int64_t wanted,
                  std::vector<int32_t> stops);

    // The next window to submit now (none while the pipeline is full, the drafts run out,
    // or the loop is done). Call it until it says none, after the start and every answer.
    std::optional<loop_window> next();

    // Window `id` answered `tokens` (one sampled token, or the accepted drafts and one more)
    // and `next_drafts`, the last stage's drafts to follow them (its drafter's; empty
    // without one): a window that starts from the answered token takes them as its drafts
    // instead of prompt lookup's. Answers may come out of order (the ring and the chain
    // race); they are taken in the windows' order, so an answer may resolve nothing until
    // the one before it comes.
    std::vector<std::pair<uint64_t, loop_answer>> answered(uint64_t id, std::vector<int32_t> tokens,
                                                           std::vector<int32_t> next_drafts = {});

    bool   done() const { return done_; }
    size_t in_flight() const { return live_.size(); }
    int    depth() const;                          // windows it keeps in flight now
    int    deepest() const { return deepest_; }    // the most it ever kept in flight

private:
    struct live_window {
        loop_window                         window;
        size_t                              known = 0; // its leading tokens the lookup holds
        std::optional<std::vector<int32_t>> tokens;    // its answer, once it came
        std::vector<int32_t>                next_drafts; // the last stage's drafts after it
    };

    loop_answer resolve_front();
    int64_t     rows_in_flight() const;
    std::vector<int32_t> speculative_tail() const;

    const loop_limits    limits_;
    const std::vector<int32_t> stops_;
    loop_drafter         drafter_;
    std::deque<live_window> live_;      // windows of the text in flight, oldest first
    std::set<uint64_t>   void_;         // dropped windows still in flight
    std::optional<int32_t> known_next_; // the token the next window starts with, when known
    std::vector<int32_t> tail_drafts_;  // the last stage's drafts to follow it (its drafter)
    int64_t              next_pos_;     // where the next window starts
    int64_t              held_;         // positions the stages hold once every window ran
    int64_t              wanted_;       // tokens the loop may still answer
    uint64_t             next_id_;
    double               accepted_ = 0;     // recent drafts accepted and checked (decaying)
    double               checked_  = 0;
    int                  run_;              // windows accepted whole in a row (optimistic at first)
    int                  deepest_    = 1;
    bool                 done_       = false;
};

} // namespace meshnet
