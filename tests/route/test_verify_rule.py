"""The accept/reject rule of speculative verification (meshnet.route.sampling.verify_drafts,
the Python twin of the last stage's OUTPUT_KIND_VERIFIED): over many seeds a draft d is
accepted with probability p(d), a rejection yields p without d renormalised, and so the
first token is distributed as plain sampling's. The bounds are 5 standard errors: a
correct rule fails them with probability below 1e-6, and the test shows that a rule that
is off by a few percent fails them."""

from __future__ import annotations

import numpy as np
import pytest

from meshnet.route.sampling import Sampling, sample, verify_drafts

LOGITS = np.array([2.0, 1.5, 1.0, 0.2, -0.5, -3.0], dtype=np.float32)
SEEDS = 20_000
POSITION = 37


def probabilities(sampling: Sampling) -> np.ndarray:
    """p after temperature / top-k / top-p, as `sample` applies them."""
    weights = np.exp((LOGITS.astype(np.float64) - LOGITS.max()) / sampling.temperature)
    order = np.argsort(-LOGITS, kind="stable")
    if sampling.top_k:
        weights[order[sampling.top_k:]] = 0.0
    if 0 < sampling.top_p < 1:
        ranked = weights[order] / weights.sum()
        kept = int(np.nonzero(np.cumsum(ranked) >= sampling.top_p)[0][0]) + 1
        weights[order[kept:]] = 0.0
    return weights / weights.sum()


def within(observed: np.ndarray, expected: np.ndarray, n: int, sigmas: float = 5.0) -> bool:
    error = np.sqrt(np.maximum(expected * (1 - expected), 1e-12) / n)
    return bool(np.all(np.abs(observed - expected) <= sigmas * error + 1e-12))


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0),
                                      Sampling(temperature=0.7, top_k=4),
                                      Sampling(temperature=1.3, top_p=0.9)])
@pytest.mark.parametrize("draft", [0, 2])
def test_a_draft_is_accepted_with_its_probability_and_a_rejection_draws_the_rest(
        sampling: Sampling, draft: int) -> None:
    p = probabilities(sampling)
    rows = np.stack([LOGITS, LOGITS])
    first = np.zeros(len(LOGITS))
    after_reject = np.zeros(len(LOGITS))
    accepted = 0
    for seed in range(SEEDS):
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        out = verify_drafts(rows, [9, draft], s, [POSITION, POSITION + 1])
        first[out[0]] += 1
        if out[0] == draft:
            accepted += 1
            assert len(out) == 2  # accepted: the next row's token follows
        else:
            after_reject[out[0]] += 1
            assert len(out) == 1  # rejected: the correction ends the step
    assert within(np.array([accepted / SEEDS]), np.array([p[draft]]), SEEDS)
    rest = p.copy()
    rest[draft] = 0.0
    rest /= rest.sum()
    rejected = SEEDS - accepted
    assert after_reject[draft] == 0
    assert within(after_reject / rejected, rest, rejected)
    assert within(first / SEEDS, p, SEEDS)  # the first token: plain sampling's law


def test_the_bound_catches_a_rule_that_is_off_by_a_few_percent() -> None:
    """The same check on a rule that also accepts 6% of what it should reject (p(d) 0.449
    -> 0.482) fails: the test has power against small errors."""
    sampling = Sampling(temperature=1.0)
    p = probabilities(sampling)
    draws = [sample(LOGITS, Sampling(1.0, 0, 0.0, seed), POSITION) for seed in range(SEEDS)]
    uniform = np.array([(seed * 0.6180339887) % 1.0 for seed in range(SEEDS)])
    biased = np.mean([d == 0 or u < 0.06 for d, u in zip(draws, uniform, strict=True)])
    assert not within(np.array([biased]), np.array([p[0]]), SEEDS)
    honest = np.mean([d == 0 for d in draws])
    assert within(np.array([honest]), np.array([p[0]]), SEEDS)
