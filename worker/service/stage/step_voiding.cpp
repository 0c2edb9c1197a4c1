// step_voiding.cpp - the voiding rules over a queue (step_voiding.h).
#include "step_voiding.h"

#include <algorithm>
#include <iterator>

namespace meshnet {

void step_voiding::rejected_from(const session_key & key, int64_t from, size_t most, const session_live & live) {
    const auto [mark, added] = rejected_.emplace(key, from);
    if (!added) {
        mark->second = std::min(mark->second, from);
    }
    if (rejected_.size() > most) {
        // more marks than sessions: those of sessions evicted since go
        for (auto it = rejected_.begin(); it != rejected_.end();) {
            it = live(it->first) ? std::next(it) : rejected_.erase(it);
        }
    }
}

void step_voiding::released(const session_key & key) {
    rejected_.erase(key);
}

std::vector<int64_t> step_voiding::void_from(const std::vector<queued_window> & queue, const session_live & live) {
    std::vector<int64_t> from(queue.size(), -1);
    // In the order they came: what a rejection voids, up to the first step that starts below
    // it or discards (a new session under the key has no mark: it was cleared at the release,
    // or the session exists only once one of its steps ran).
    for (size_t i = 0; i < queue.size() && !rejected_.empty(); ++i) {
        const queued_window & step = queue[i];
        const auto            mark = rejected_.find(step.key);
        if (mark == rejected_.end()) {
            continue;
        }
        if (step.discard_from >= 0 || step.n_past < mark->second || !live(step.key)) {
            rejected_.erase(mark);
        } else {
            from[i] = mark->second;
        }
    }
    // Latest first: what a later queued step discards.
    std::map<session_key, int64_t> discards; // each session's lowest discard_from among later steps
    for (size_t i = queue.size(); i-- > 0;) {
        const queued_window & step  = queue[i];
        const auto            later = discards.find(step.key);
        if (from[i] < 0 && later != discards.end() && step.n_past >= later->second) {
            from[i] = later->second;
        }
        if (from[i] < 0 && step.discard_from >= 0) {
            discards[step.key] = later == discards.end() ? step.discard_from : std::min(later->second, step.discard_from);
        }
    }
    return from;
}

int64_t void_after_run(const session_key & key, int64_t n_past, const std::vector<queued_window> & queue) {
    int64_t lowest = -1;
    for (const queued_window & step : queue) {
        if (step.discard_from >= 0 && step.key == key && (lowest < 0 || step.discard_from < lowest)) {
            lowest = step.discard_from;
        }
    }
    return lowest >= 0 && n_past >= lowest ? lowest : -1;
}

} // namespace meshnet
