// loop_drafts.cpp - prompt lookup and the adaptive draft length of a speculative loop.
#include "loop_drafts.h"

#include <algorithm>

namespace meshnet {

loop_draft_source_factory bench_loop_draft_source = nullptr;

void prompt_lookup::extend(const std::vector<int32_t> & tokens) {
    for (int32_t token : tokens) {
        // The n-grams ending just before this token now have a continuation: it.
        const size_t end = tokens_.size();
        for (size_t n = 1; n <= std::min<size_t>(max_ngram, end); ++n) {
            index_[std::vector<int32_t>(tokens_.end() - static_cast<std::ptrdiff_t>(n), tokens_.end())] = end;
        }
        tokens_.push_back(token);
    }
}

std::vector<int32_t> prompt_lookup::draft_after(const std::vector<int32_t> & tail, int length) const {
    if (length <= 0) {
        return {};
    }
    // The sequence as if `tail` were appended, read without copying the committed part.
    const size_t end = tokens_.size() + tail.size();
    auto at = [&](size_t i) { return i < tokens_.size() ? tokens_[i] : tail[i - tokens_.size()]; };
    for (size_t n = std::min<size_t>(max_ngram, end); n >= 1; --n) {
        std::vector<int32_t> suffix;
        for (size_t i = end - n; i < end; ++i) {
            suffix.push_back(at(i));
        }
        const auto found = index_.find(suffix);
        if (found != index_.end()) {
            const size_t stop = std::min(end, found->second + static_cast<size_t>(length));
            std::vector<int32_t> out;
            for (size_t i = found->second; i < stop; ++i) {
                out.push_back(at(i));
            }
            return out;
        }
    }
    return {};
}

void draft_length::decoded_plainly(int tokens) {
    paused_for_ = std::max(0, paused_for_ - tokens);
}

void draft_length::verified(int drafted, int accepted) {
    if (drafted <= 0) {
        return;
    }
    length_ = accepted == drafted ? std::min(most_, length_ * 2) : std::max(1, accepted);
    if (accepted > 0) {
        failures_   = 0;
        next_pause_ = pause;
        return;
    }
    if (++failures_ >= patience) {
        paused_for_ = next_pause_;
        next_pause_ = std::min(max_pause, next_pause_ * 2);
        failures_   = patience - 1; // a failing probe pauses again at once
    }
}

void loop_drafter::answered(const std::vector<int32_t> & fed, const std::vector<int32_t> & produced) {
    if (bench_) {
        bench_->answered(fed, produced);
        return;
    }
    const int drafted = static_cast<int>(fed.size()) - 1;
    if (drafted > 0) {
        length_.verified(drafted, static_cast<int>(produced.size()) - 1);
    } else {
        length_.decoded_plainly(static_cast<int>(produced.size()));
    }
    lookup_.extend(produced);
}

std::vector<int32_t> loop_drafter::next(int room) const {
    if (bench_) {
        return bench_->next(room);
    }
    return lookup_.draft(std::min(room, length_.wanted()));
}

} // namespace meshnet
