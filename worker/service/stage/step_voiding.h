// step_voiding.h - which queued steps are void (pure: no threads, no transport): a decode
// loop's windows that a later step discards, or that build on drafts the last stage
// rejected, are answered STEP_SUPERSEDED instead of run or passed on.
//
// The rules, over a stage's queue in the order the steps came:
// - a rejection mark (the last stage rejected drafts of the session's step whose rows end
//   before `from`) voids the session's steps from `from` on, up to its first step that
//   starts below `from` or discards (the step after the rejection): that one clears the
//   mark, as do the session's release and its absence (a mark matters only to a live
//   session; one made anew under the key starts unmarked);
// - a step that discards from `d`, and is not void itself, voids the session's steps queued
//   before it at n_past >= d (the lowest such `d` counts);
// - on a stage before the last, a step that ran is not passed on when a step of its session
//   queued meanwhile discards its positions (the stages after it would compute a void window).
#pragma once

#include "session_store.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace meshnet {

// A queued step as the rules see it.
struct queued_window {
    session_key key;
    int64_t     n_past       = 0;
    int64_t     discard_from = -1; // >= 0: the step drops the session's positions from here first
};

// Whether a session holds a slot on the stage now.
using session_live = std::function<bool(const session_key &)>;

class step_voiding {
public:
    // The last stage rejected drafts of the session's step whose rows end before `from`
    // (the lowest mark counts). Past `most` marks, those of sessions no longer `live` go.
    void rejected_from(const session_key & key, int64_t from, size_t most, const session_live & live);
    // The session was released: a session made anew under the key starts unmarked.
    void released(const session_key & key);

    // Per queued step, in the order they came: the position its voiding starts at, or -1
    // when it runs. Clears the marks the queue ends.
    std::vector<int64_t> void_from(const std::vector<queued_window> & queue, const session_live & live);

    size_t marks() const { return rejected_.size(); }

private:
    std::map<session_key, int64_t> rejected_; // marks not yet cleared
};

// A step of the session at `n_past` that ran on a stage before the last: the position its
// voiding starts at when a step of its session still queued discards its positions, else
// -1 (it is passed on).
int64_t void_after_run(const session_key & key, int64_t n_past, const std::vector<queued_window> & queue);

} // namespace meshnet
