// hidden_rows.cpp - see hidden_rows.h.
#include "hidden_rows.h"

#include <algorithm>

namespace meshnet {

void hidden_rows::add(int32_t pos0, const std::vector<float> & rows) {
    const int32_t n = static_cast<int32_t>(rows.size() / width_);
    if (n <= 0) {
        return;
    }
    if (pos0 < first_ || pos0 > end()) {
        clear(); // a gap (or a restart before what is held): nothing earlier pairs with it
    }
    if (rows_.empty()) {
        first_ = pos0;
    }
    drop_from(pos0);
    if (n >= keep_) { // only the latest keep_ of them stay
        const size_t skip = static_cast<size_t>(n - keep_) * width_;
        rows_.assign(rows.begin() + static_cast<long>(skip), rows.begin() + static_cast<long>(static_cast<size_t>(n) * width_));
        first_ = pos0 + n - keep_;
        return;
    }
    rows_.insert(rows_.end(), rows.begin(), rows.begin() + static_cast<long>(static_cast<size_t>(n) * width_));
    const int32_t held = end() - first_;
    if (held > keep_) {
        const int32_t gone = held - keep_;
        rows_.erase(rows_.begin(), rows_.begin() + static_cast<long>(static_cast<size_t>(gone) * width_));
        first_ += gone;
    }
}

const float * hidden_rows::at(int32_t pos) const {
    if (pos < first_ || pos >= end()) {
        return nullptr;
    }
    return rows_.data() + static_cast<size_t>(pos - first_) * width_;
}

void hidden_rows::drop_from(int32_t from) {
    if (from <= first_) {
        rows_.clear();
        return;
    }
    if (from < end()) {
        rows_.resize(static_cast<size_t>(from - first_) * width_);
    }
}

int32_t draft_argmax(const float * logits, int32_t n_vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

} // namespace meshnet
