// loop_windows.cpp - a ForwardStream's decode loops on the stream's side: limits, window
// steps and the order answers are written in.
#include "loop_windows.h"

#include <algorithm>

namespace meshnet {

loop_limits loop_limits_for(const pb::ForwardRequest & request, const loop_stage_limits & stage) {
    loop_limits limits;
    limits.drafts  = std::min({static_cast<int>(request.loop_drafts()), static_cast<int>(stage.max_drafts),
                               std::max(0, stage.exact_rows - 1)});
    limits.windows = std::clamp<int>(static_cast<int>(request.loop_windows()), 1, stage.max_windows);
    limits.n_ctx   = stage.n_ctx;
    limits.discard_depth = stage.discard_depth;
    return limits;
}

static loop_window first_window(const pb::ForwardRequest & request, uint64_t id) {
    loop_window first;
    first.id     = id;
    first.n_past = request.n_past();
    first.tokens.assign(request.tokens().begin(), request.tokens().end());
    first.verify = request.output().kind() == pb::OUTPUT_KIND_VERIFIED;
    return first;
}

decode_loop::decode_loop(pb::ForwardRequest & request, const loop_limits & limits, uint64_t first_id)
    : pipeline_(limits, {request.draft_context().begin(), request.draft_context().end()},
                first_window(request, first_id), static_cast<int64_t>(request.continue_tokens()) + 1,
                {request.stop_token_ids().begin(), request.stop_token_ids().end()}) {
    request.clear_draft_context(); // in the drafter now; the windows copy the request
    request.set_want_drafts(static_cast<uint32_t>(std::max(limits.drafts, 0)));
    request.set_window(first_id);
    base_ = request;
}

std::optional<pb::ForwardRequest> decode_loop::next() {
    const std::optional<loop_window> window = pipeline_.next();
    if (!window) {
        return std::nullopt;
    }
    pb::ForwardRequest step = base_;
    step.set_window(window->id);
    step.set_n_past(window->n_past);
    step.clear_positions();
    step.clear_tokens();
    step.mutable_tokens()->Add(window->tokens.begin(), window->tokens.end());
    for (size_t i = 0; i < window->tokens.size(); ++i) {
        step.add_positions(static_cast<int32_t>(window->n_past + static_cast<int64_t>(i)));
    }
    if (window->discard_from >= 0) {
        step.set_discard_from(window->discard_from);
    } else {
        step.clear_discard_from();
    }
    step.mutable_output()->clear_rows();
    step.mutable_output()->set_kind(window->verify ? pb::OUTPUT_KIND_VERIFIED : pb::OUTPUT_KIND_SAMPLED);
    step.set_continue_tokens(1); // a loop's step: it rides the ring (the pipeline counts)
    return step;
}

std::vector<std::pair<uint64_t, bool>> decode_loop::answered(uint64_t window, std::vector<int32_t> tokens,
                                                             std::vector<int32_t> next_drafts) {
    std::vector<std::pair<uint64_t, bool>> verdicts;
    for (const auto & [resolved, verdict] : pipeline_.answered(window, std::move(tokens), std::move(next_drafts))) {
        verdicts.emplace_back(resolved, verdict.answer);
        for (uint64_t dropped : verdict.dropped) {
            verdicts.emplace_back(dropped, false);
        }
    }
    return verdicts;
}

uint64_t answer_order::queued(uint64_t window) {
    const uint64_t seq = next_seq_++;
    step & queued = steps_[seq];
    queued.window = window;
    if (window != 0) {
        windows_[window] = seq;
    } else {
        queued.text = true;
    }
    return seq;
}

void answer_order::decide(uint64_t window, bool text) {
    const auto found = windows_.find(window);
    if (found == windows_.end()) {
        return;
    }
    step & decided = steps_.at(found->second);
    if (!decided.text) {
        decided.text = text;
    }
}

bool answer_order::dropped(uint64_t seq) const {
    const auto found = steps_.find(seq);
    return found != steps_.end() && found->second.text.has_value() && !*found->second.text;
}

void answer_order::answered(uint64_t seq) {
    if (const auto found = steps_.find(seq); found != steps_.end()) {
        found->second.answered = true;
    }
}

std::vector<std::pair<uint64_t, bool>> answer_order::due() {
    std::vector<std::pair<uint64_t, bool>> out;
    while (!steps_.empty() && steps_.begin()->first == next_write_) {
        const step & front = steps_.begin()->second;
        if (!front.answered || !front.text) {
            break; // its answer, or an earlier window's tokens, have not come yet
        }
        out.emplace_back(next_write_, *front.text);
        if (front.window != 0) {
            windows_.erase(front.window);
        }
        steps_.erase(steps_.begin());
        ++next_write_;
    }
    return out;
}

} // namespace meshnet
