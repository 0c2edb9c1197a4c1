// sampling.h - last-stage token sampling, bit-for-bit the algorithm of the Python
// route driver (meshnet.route.sampling) so either side may sample.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace meshnet {

struct sampling_params {
    float    temperature = 0.0f; // <= 0: greedy
    int32_t  top_k       = 0;    // 0: no cut
    float    top_p       = 0.0f; // 0 or >= 1: no cut
    uint64_t seed        = 0;
};

// The uniform draw in [0, 1) for a row at `position` (splitmix64 of seed and position).
double sampling_uniform(uint64_t seed, int64_t position);

// One token from n_vocab logits for the row at `position`.
int32_t sample_token(const float * logits, int32_t n_vocab, const sampling_params & params, int64_t position);

// The k highest logits, descending (ties: lower id first).
std::vector<std::pair<int32_t, float>> top_k_logits(const float * logits, int32_t n_vocab, int32_t k);

} // namespace meshnet
