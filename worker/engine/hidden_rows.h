// hidden_rows.h - the last stage's recent hidden rows of one slot, by position: an MTP drafter
// pairs the token at position p with the model's hidden state at p - 1, so the rows of the
// last steps are kept until a later step, a discard or a clear replaces them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshnet {

class hidden_rows {
public:
    // rows of `width` floats; at most `keep` of the latest positions are held
    hidden_rows(size_t width, int32_t keep) : width_(width), keep_(keep) {}

    // the step's rows for positions pos0..pos0+n-1 (n = rows.size() / width); rows held at
    // pos0 and after (drafts the step replaces) are dropped first, and rows before pos0 that
    // do not continue up to it are forgotten
    void add(int32_t pos0, const std::vector<float> & rows);

    // the row at `pos`, or null when it is not held
    const float * at(int32_t pos) const;

    // forget the rows at `from` and after
    void drop_from(int32_t from);

    void clear() { rows_.clear(); first_ = 0; }

    int32_t first() const { return first_; }
    int32_t end() const { return first_ + static_cast<int32_t>(rows_.size() / width_); }
    size_t  bytes() const { return rows_.capacity() * sizeof(float); }

private:
    size_t             width_;
    int32_t            keep_;
    int32_t            first_ = 0; // position of the first row held
    std::vector<float> rows_;
};

// The draft a distribution proposes: its most likely token, the lowest id among equals, so
// that a draft is a function of the logits alone.
int32_t draft_argmax(const float * logits, int32_t n_vocab);

} // namespace meshnet
