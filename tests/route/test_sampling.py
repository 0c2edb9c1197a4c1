"""The driver's sampler draws exactly what the last stage's C++ sampler draws
(worker/tests/test-sampling.cpp prints the same vectors)."""

from __future__ import annotations

import numpy as np
import pytest

from meshnet.route.sampling import Sampling, sample, uniform

LOGITS = np.array([0.1, 2.0, 1.5, -3.0, 2.0, 0.7], dtype=np.float32)


def test_the_uniform_draw_matches_the_cpp_splitmix64_vectors() -> None:
    assert uniform(42, 7) == 0.43230474876977543
    assert uniform(0, 0) == 0.65244848637403219


def test_temperature_zero_picks_the_highest_logit_lowest_id_on_ties() -> None:
    assert sample(LOGITS, Sampling(), position=0) == 1


def test_the_same_seed_and_position_always_draw_the_same_token() -> None:
    sampling = Sampling(temperature=0.9, seed=42)
    assert [sample(LOGITS, sampling, p) for p in range(50)] == [
        sample(LOGITS, sampling, p) for p in range(50)
    ]


def test_a_high_temperature_spreads_draws_over_the_vocabulary() -> None:
    drawn = {sample(LOGITS, Sampling(temperature=5.0, seed=7), p) for p in range(200)}
    assert len(drawn) >= 5


def test_top_k_of_one_and_a_tiny_top_p_reduce_to_greedy() -> None:
    for position in range(20):
        assert sample(LOGITS, Sampling(temperature=1.0, top_k=1, seed=3), position) == 1
        assert sample(LOGITS, Sampling(temperature=1.0, top_p=0.01, seed=3), position) == 1


def test_top_k_keeps_draws_among_the_k_best() -> None:
    drawn = {sample(LOGITS, Sampling(temperature=10.0, top_k=3, seed=1), p) for p in range(300)}
    assert drawn <= {1, 4, 2}


def test_impossible_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Sampling(temperature=-1.0)
    with pytest.raises(ValueError):
        Sampling(top_p=1.5)
