// draft_verify.cpp - see draft_verify.h.
#include "draft_verify.h"

#include <string>

namespace meshnet {

std::optional<shard_error> check_discard(const ::meshnet::shard::v1::ForwardRequest & request,
                                         const engine_info & info) {
    if (!request.has_discard_from()) {
        return std::nullopt;
    }
    if (!info.can_discard) {
        return make_error(error_reason::discard_unsupported,
            "the memory of this stage (" + info.arch + ") cannot drop a suffix of a session's positions");
    }
    if (request.discard_from() != request.n_past()) {
        return make_error(error_reason::invalid_positions,
            "discard_from " + std::to_string(request.discard_from()) + " must equal n_past " +
            std::to_string(request.n_past()) + ": the step builds on the positions kept");
    }
    return std::nullopt;
}

std::optional<shard_error> discard_suffix(engine_i & engine, int32_t slot, int64_t from) {
    const int32_t held = slot < 0 ? 0 : engine.slot_n_past(slot);
    if (slot < 0 || from < 0 || held <= from) {
        return std::nullopt;
    }
    const discard_result result = engine.slot_discard(slot, static_cast<int32_t>(from));
    const std::string positions = std::to_string(held - from);
    switch (result.status) {
        case discard_status::done:
            return std::nullopt;
        case discard_status::too_deep:
            return make_error(error_reason::discard_too_deep,
                "the stage can restore its last " + std::to_string(result.restorable) + " positions now (at most " +
                std::to_string(engine.info().discard_depth) + ", and once before the next step), not " + positions +
                "; the session is as it was",
                {{"discard_depth", std::to_string(result.restorable)}, {"positions", positions}});
        case discard_status::unsupported:
            break;
    }
    return make_error(error_reason::discard_unsupported,
        "the stage's memory could not drop positions from " + std::to_string(from) +
        "; the session is as it was");
}

std::vector<int32_t> verify_drafts(const float * logits, int32_t n_vocab, const sampling_params & params,
                                   const std::vector<int32_t> & positions, const std::vector<int32_t> & tokens) {
    std::vector<int32_t> out;
    for (size_t i = 0; i < positions.size(); ++i) {
        const int32_t token = sample_token(logits + i * static_cast<size_t>(n_vocab), n_vocab, params, positions[i]);
        out.push_back(token);
        if (i + 1 >= tokens.size() || token != tokens[i + 1]) {
            break;
        }
    }
    return out;
}

} // namespace meshnet
