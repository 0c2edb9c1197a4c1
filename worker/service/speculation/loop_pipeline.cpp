// loop_pipeline.cpp - see loop_pipeline.h.
#include "loop_pipeline.h"

#include <algorithm>

namespace meshnet {

namespace {

// Pipelining pays only while most drafts hold: one rejection voids every later window
// (a peer measured pipelined speculation collapse below a per-token acceptance of ~0.8).
constexpr double pipelining_acceptance = 0.8;
// The acceptance is drafts accepted over drafts checked, each window's counts weighing
// this much less per later window: token-weighted, so one short failing window does not
// outweigh the long runs before it.
constexpr double acceptance_decay = 0.8;

std::vector<int32_t> joined(std::vector<int32_t> a, const std::vector<int32_t> & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

} // namespace

loop_pipeline::loop_pipeline(loop_limits limits, const std::vector<int32_t> & context, loop_window first,
                             int64_t wanted, std::vector<int32_t> stops)
    : limits_(limits), stops_(std::move(stops)), drafter_(std::max(1, limits.drafts), joined(context, first.tokens)),
      next_pos_(first.n_past + static_cast<int64_t>(first.tokens.size())), held_(next_pos_), wanted_(wanted),
      next_id_(first.id + 1), run_(limits.windows) {
    const size_t fed = first.tokens.size();
    live_.push_back(live_window{std::move(first), fed, std::nullopt});
}

int loop_pipeline::depth() const {
    if (limits_.drafts <= 0 || (checked_ > 0 && accepted_ < pipelining_acceptance * checked_)) {
        return 1;
    }
    return std::max(1, std::min({limits_.windows, limits_.drafts + 1, run_ + 1}));
}

int64_t loop_pipeline::rows_in_flight() const {
    int64_t rows = 0;
    for (const live_window & live : live_) {
        rows += static_cast<int64_t>(live.window.tokens.size());
    }
    return rows;
}

std::vector<int32_t> loop_pipeline::speculative_tail() const {
    std::vector<int32_t> tail;
    for (const live_window & live : live_) {
        tail.insert(tail.end(), live.window.tokens.begin() + static_cast<std::ptrdiff_t>(live.known),
                    live.window.tokens.end());
    }
    return tail;
}

std::optional<loop_window> loop_pipeline::next() {
    if (done_ || static_cast<int>(live_.size()) >= depth()) {
        return std::nullopt;
    }
    // Every row in flight answers at most one token, and every position must fit the context.
    const int64_t rows_left = wanted_ - rows_in_flight();
    const int64_t room      = std::min(rows_left, limits_.n_ctx - next_pos_);
    if (room < 1) {
        return std::nullopt;
    }
    loop_window window;
    if (live_.empty()) {
        if (!known_next_) {
            return std::nullopt;
        }
        int64_t drafts = std::min<int64_t>({drafter_.wanted(), limits_.drafts, room - 1});
        if (limits_.discard_depth > 0) {
            drafts = std::min(drafts, limits_.discard_depth); // all but its first may be dropped
        }
        window.tokens = {*known_next_};
        if (limits_.drafts > 0 && !tail_drafts_.empty()) {
            // the last stage's drafter saw the model's own hidden state: its drafts, as many
            // as fit (prompt lookup's adaptive length is for lookup's guesses)
            int64_t tail = std::min<int64_t>({static_cast<int64_t>(tail_drafts_.size()), limits_.drafts, room - 1});
            if (limits_.discard_depth > 0) {
                tail = std::min(tail, limits_.discard_depth);
            }
            window.tokens.insert(window.tokens.end(), tail_drafts_.begin(),
                                 tail_drafts_.begin() + static_cast<std::ptrdiff_t>(std::max<int64_t>(tail, 0)));
        } else if (limits_.drafts > 0 && drafts > 0) {
            const std::vector<int32_t> drafted = drafter_.next(static_cast<int>(drafts));
            window.tokens.insert(window.tokens.end(), drafted.begin(), drafted.end());
        }
        known_next_.reset();
        tail_drafts_.clear();
    } else {
        // A pipelined window: every token of it is drafted, the first one in place of the
        // token its predecessor will answer last. A rejection anywhere in flight drops all
        // but the oldest window's first token: keep that within what a discard can drop.
        int64_t rows = std::min<int64_t>(1 + std::min(drafter_.wanted(), limits_.drafts), room);
        if (limits_.discard_depth > 0) {
            rows = std::min(rows, limits_.discard_depth + 1 - rows_in_flight());
        }
        if (drafter_.wanted() == 0 || rows < 1) {
            return std::nullopt;
        }
        window.tokens = drafter_.after(speculative_tail(), static_cast<int>(rows));
        if (window.tokens.empty()) {
            return std::nullopt;
        }
    }
    window.id     = next_id_++;
    window.n_past = next_pos_;
    window.verify = window.tokens.size() > 1;
    if (held_ > next_pos_) {
        window.discard_from = next_pos_; // what dropped windows and rejected drafts left
    }
    next_pos_ += static_cast<int64_t>(window.tokens.size());
    held_      = next_pos_;
    live_.push_back(live_window{window, live_.empty() ? size_t{1} : size_t{0}, std::nullopt});
    deepest_ = std::max(deepest_, static_cast<int>(live_.size()));
    return window;
}

std::vector<std::pair<uint64_t, loop_answer>> loop_pipeline::answered(uint64_t id, std::vector<int32_t> tokens,
                                                                      std::vector<int32_t> next_drafts) {
    std::vector<std::pair<uint64_t, loop_answer>> resolved;
    if (void_.erase(id) > 0) {
        return resolved; // a dropped window: its verdict went out when it was dropped
    }
    auto found = std::find_if(live_.begin(), live_.end(), [id](const live_window & live) {
        return live.window.id == id;
    });
    if (found == live_.end() || tokens.empty()) {
        return resolved;
    }
    found->tokens      = std::move(tokens);
    found->next_drafts = std::move(next_drafts);
    while (!live_.empty() && live_.front().tokens) {
        const uint64_t front = live_.front().window.id;
        resolved.emplace_back(front, resolve_front());
    }
    return resolved;
}

loop_answer loop_pipeline::resolve_front() {
    live_window live = std::move(live_.front());
    live_.pop_front();
    const loop_window &          window = live.window;
    const std::vector<int32_t> & sampled = *live.tokens;
    loop_answer answer;
    answer.answer = true;
    wanted_ -= static_cast<int64_t>(sampled.size());

    const size_t rows = window.tokens.size();
    // All its drafts held (a window without drafts answers its one token).
    const bool whole = !window.verify || sampled.size() == rows;
    const bool confirmed = whole && !live_.empty() && live_.front().window.tokens.front() == sampled.back();
    const int checked  = (window.verify ? static_cast<int>(rows) - 1 : 0) + (live_.empty() ? 0 : 1);
    const int accepted = (window.verify ? static_cast<int>(sampled.size()) - 1 : 0) + (confirmed ? 1 : 0);
    if (checked > 0) {
        accepted_ = acceptance_decay * accepted_ + accepted;
        checked_  = acceptance_decay * checked_ + checked;
    }
    drafter_.answered(window.verify ? window.tokens : std::vector<int32_t>{window.tokens.back()}, sampled);

    const bool stop = std::find_first_of(sampled.begin(), sampled.end(), stops_.begin(), stops_.end()) != sampled.end();
    // Each window accepted whole lets one more window into the pipe; a rejection, which
    // voids what is behind it, starts it over from one.
    run_ = whole && (confirmed || live_.empty()) ? run_ + 1 : 0;
    if (confirmed && !stop && wanted_ > 0) {
        live_.front().known = 1; // its first token is the one just answered
        return answer;
    }
    for (const live_window & later : live_) {
        answer.dropped.push_back(later.window.id);
        if (!later.tokens) {
            void_.insert(later.window.id);
        }
    }
    live_.clear();
    known_next_  = sampled.back();
    tail_drafts_ = std::move(live.next_drafts);
    next_pos_   = window.n_past + static_cast<int64_t>(window.verify ? sampled.size() : rows);
    if (stop || wanted_ <= 0) {
        done_       = true;
        answer.done = true;
    }
    return answer;
}

} // namespace meshnet
