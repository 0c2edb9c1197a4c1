// sampling.cpp - greedy / temperature / top-k / top-p with a positional seed, so a
// re-prefilled session draws the same tokens again.
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace meshnet {

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

double sampling_uniform(uint64_t seed, int64_t position) {
    const uint64_t z = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(position)));
    return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

static bool ranks_before(const float * logits, int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

std::vector<std::pair<int32_t, float>> top_k_logits(const float * logits, int32_t n_vocab, int32_t k) {
    k = std::max(0, std::min(k, n_vocab));
    std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int32_t a, int32_t b) { return ranks_before(logits, a, b); });
    std::vector<std::pair<int32_t, float>> out;
    out.reserve(static_cast<size_t>(k));
    for (int32_t i = 0; i < k; ++i) {
        out.emplace_back(ids[static_cast<size_t>(i)], logits[ids[static_cast<size_t>(i)]]);
    }
    return out;
}

// The first id of the highest logit. Lanes of independent maxima let the compiler use
// vector instructions (a third of the time of one running maximum), and the last stage
// answers every token of every session this way.
static int32_t argmax(const float * logits, int32_t n_vocab) {
    constexpr int32_t lanes = 16;
    float best[lanes];
    std::fill(best, best + lanes, logits[0]);
    int32_t i = 0;
    for (; i + lanes <= n_vocab; i += lanes) {
        for (int32_t j = 0; j < lanes; ++j) {
            best[j] = logits[i + j] > best[j] ? logits[i + j] : best[j];
        }
    }
    float top = best[0];
    for (int32_t j = 1; j < lanes; ++j) {
        top = best[j] > top ? best[j] : top;
    }
    for (; i < n_vocab; ++i) {
        top = logits[i] > top ? logits[i] : top;
    }
    for (int32_t id = 0; id < n_vocab; ++id) {
        if (logits[id] == top) {
            return id;
        }
    }
    return 0; // logits[0] is NaN
}

int32_t sample_token(const float * logits, int32_t n_vocab, const sampling_params & params, int64_t position) {
    if (params.temperature <= 0.0f) {
        return argmax(logits, n_vocab);
    }
    const int32_t k = params.top_k > 0 ? std::min(params.top_k, n_vocab) : n_vocab;
    const auto candidates = top_k_logits(logits, n_vocab, k);
    const double max_logit = candidates.front().second;
    std::vector<double> weights(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) {
        weights[i] = std::exp((static_cast<double>(candidates[i].second) - max_logit) / params.temperature);
    }
    size_t kept = weights.size();
    if (params.top_p > 0.0f && params.top_p < 1.0f) {
        const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
        double cumulative = 0.0;
        for (size_t i = 0; i < weights.size(); ++i) {
            cumulative += weights[i] / total;
            if (cumulative >= params.top_p) {
                kept = i + 1;
                break;
            }
        }
    }
    double total = 0.0;
    for (size_t i = 0; i < kept; ++i) {
        total += weights[i];
    }
    const double target = sampling_uniform(params.seed, position) * total;
    double cumulative = 0.0;
    for (size_t i = 0; i < kept; ++i) {
        cumulative += weights[i];
        if (target < cumulative) {
            return candidates[i].first;
        }
    }
    return candidates[kept - 1].first;
}

} // namespace meshnet
