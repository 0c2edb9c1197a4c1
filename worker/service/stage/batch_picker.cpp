// batch_picker.cpp - see batch_picker.h.
#include "batch_picker.h"

#include <algorithm>

namespace meshnet {

std::vector<size_t> pick_batch(const std::vector<queued_step> & queue, const batch_limits & limits) {
    std::vector<size_t> picked;
    if (queue.empty()) {
        return picked;
    }
    const bool exact = limits.exact_rows > 0;
    const size_t most = exact && queue.front().n_tokens == 1
        ? std::min(limits.max_steps, limits.exact_rows) : limits.max_steps;
    int64_t tokens = 0;
    for (size_t i = 0; i < queue.size() && picked.size() < most; ++i) {
        const queued_step & step = queue[i];
        if (!picked.empty()) {
            if (exact && (step.n_tokens != 1 || queue[picked.front()].n_tokens != 1)) {
                continue; // a prefill runs alone, and decodes without one
            }
            if (tokens + step.n_tokens > limits.max_tokens) {
                continue;
            }
            const bool same_session = std::any_of(picked.begin(), picked.end(),
                [&](size_t j) { return queue[j].key == step.key; });
            if (same_session) {
                continue;
            }
        }
        tokens += step.n_tokens;
        picked.push_back(i);
    }
    return picked;
}

} // namespace meshnet
