// fake_engine.cpp - see fake_engine.h; honours the engine contract's cache and
// capacity rules so the service's checks are exercised for real.
#include "fake_engine.h"

#include <algorithm>

namespace meshnet {

fake_engine::fake_engine(int32_t n_layer, int32_t layer_begin, int32_t layer_end, int32_t n_slots, int32_t n_ctx)
    : slot_n_past_(static_cast<size_t>(n_slots), 0), fail_slot_(static_cast<size_t>(n_slots), false) {
    info_.arch         = "fake";
    info_.n_layer      = n_layer;
    info_.layers       = {layer_begin, layer_end < 0 ? n_layer : layer_end};
    info_.n_embd       = fake_n_embd;
    info_.n_vocab      = fake_n_vocab;
    info_.has_vocab    = true;
    info_.schema       = boundary_schema::dense_residual;
    info_.boundary_row = fake_n_embd;
    info_.n_ctx        = n_ctx;
    info_.n_slots      = n_slots;
    info_.can_discard  = true;
}

int32_t fake_engine::expected_token(int32_t token, int32_t position, int32_t n_layer) {
    return (token + position + n_layer) % fake_n_vocab;
}

std::vector<step_result> fake_engine::step(const std::vector<step_request> & requests) {
    if (before_step) {
        before_step();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    batch_sizes_.push_back(requests.size());
    std::vector<step_result> results(requests.size());
    const int32_t layers = info_.layers.n_layers();
    for (size_t r = 0; r < requests.size(); ++r) {
        const step_request & request = requests[r];
        step_result & result = results[r];
        const size_t slot = static_cast<size_t>(request.slot);
        const size_t n = request.positions.size();
        if (slot >= slot_n_past_.size()) {
            result.status = engine_status::invalid_argument;
            continue;
        }
        if (fail_slot_[slot]) {
            fail_slot_[slot]   = false;
            slot_n_past_[slot] = 0;
            result.status  = engine_status::internal;
            result.message = "injected failure";
            continue;
        }
        if (n == 0 || request.positions[0] != slot_n_past_[slot]) {
            result.status = engine_status::cache_miss;
            continue;
        }
        if (slot_n_past_[slot] + static_cast<int32_t>(n) > info_.n_ctx) {
            result.status = engine_status::context_overflow;
            continue;
        }
        for (const pending_copy & copy : pending_) { // they land as the step computes: on a
            // slot cleared since, that another session now computes in, they overwrite it
            copies_onto_live_ += slot_n_past_[static_cast<size_t>(copy.slot)] != copy.n &&
                std::any_of(requests.begin(), requests.end(),
                            [&](const step_request & other) { return other.slot == copy.slot; });
        }
        pending_.clear();
        std::vector<float> rows(n * fake_n_embd);
        for (size_t i = 0; i < n; ++i) {
            float * row = &rows[i * fake_n_embd];
            if (info_.is_first()) {
                row[0] = static_cast<float>(request.tokens[i]);
                row[1] = static_cast<float>(request.positions[i]);
                row[2] = 0.0f;
                row[3] = static_cast<float>(slot_n_past_[slot]);
            } else {
                for (int32_t j = 0; j < fake_n_embd; ++j) {
                    row[j] = request.boundary[i * fake_n_embd + static_cast<size_t>(j)];
                }
            }
            row[2] += static_cast<float>(layers);
        }
        slot_n_past_[slot] += static_cast<int32_t>(n);
        if (!info_.is_last()) {
            result.boundary = std::move(rows);
            continue;
        }
        for (int32_t out_row : request.output_rows) {
            const float * row = &rows[static_cast<size_t>(out_row) * fake_n_embd];
            const int32_t target = (static_cast<int32_t>(row[0]) + static_cast<int32_t>(row[1]) +
                                    static_cast<int32_t>(row[2])) % fake_n_vocab;
            for (int32_t v = 0; v < fake_n_vocab; ++v) {
                const int32_t distance = (v - target + fake_n_vocab) % fake_n_vocab;
                result.logits.push_back(v == target ? 10.0f : -static_cast<float>(distance) * 0.1f);
            }
        }
    }
    return results;
}

int32_t fake_engine::slot_n_past(int32_t slot) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return slot_n_past_.at(static_cast<size_t>(slot));
}

bool fake_engine::slot_copy_prefix(int32_t source, int32_t slot, int32_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    int32_t &     held   = slot_n_past_.at(static_cast<size_t>(slot));
    const int32_t copies = slot_n_past_.at(static_cast<size_t>(source));
    if (!info_.can_copy_prefix || (info_.copies_whole_only ? n != copies : n > copies)) {
        held = 0;
        return false;
    }
    held = n; // its positions at once (a whole sequence's contents at the next step that computes)
    if (info_.copies_whole_only) {
        pending_.push_back({source, slot, n});
    }
    return true;
}

size_t fake_engine::pending_copies() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_.size();
}

int fake_engine::copies_onto_live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return copies_onto_live_;
}

void fake_engine::slot_clear(int32_t slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    slot_n_past_.at(static_cast<size_t>(slot)) = 0;
}

discard_result fake_engine::slot_discard(int32_t slot, int32_t from) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!info_.can_discard) {
        return {discard_status::unsupported, 0};
    }
    int32_t & held = slot_n_past_.at(static_cast<size_t>(slot));
    if (info_.discard_depth > 0 && held - from > info_.discard_depth) {
        return {discard_status::too_deep, info_.discard_depth};
    }
    held = std::min(held, from);
    return {};
}

int64_t fake_engine::kv_used() const {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t used = 0;
    for (int32_t n : slot_n_past_) used += n;
    return used;
}

int64_t fake_engine::kv_total() const {
    return static_cast<int64_t>(info_.n_slots) * info_.n_ctx;
}

engine_status fake_engine::tokenize(const std::string & text, bool add_special, const std::vector<text_range> & literal,
                                    std::vector<int32_t> & out) const {
    out.clear();
    if (!literal_ranges_valid(literal, text.size())) {
        return engine_status::invalid_argument;
    }
    if (add_special) out.push_back(1);
    for (unsigned char c : text) out.push_back(static_cast<int32_t>(c) % fake_n_vocab);
    return engine_status::ok;
}

engine_status fake_engine::detokenize(const std::vector<int32_t> & tokens, std::string & out) const {
    out.clear();
    for (int32_t t : tokens) out.push_back(static_cast<char>('a' + t % 26));
    return engine_status::ok;
}

void fake_engine::fail_next_step_of(int32_t slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_slot_.at(static_cast<size_t>(slot)) = true;
}

std::vector<size_t> fake_engine::batch_sizes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return batch_sizes_;
}

} // namespace meshnet
