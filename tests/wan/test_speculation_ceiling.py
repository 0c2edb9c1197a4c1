"""The closed-form ceiling that bench/wan_bench.py --acceptance measures the ring's
speculation against (meshnet.devtools.speculation_ceiling): the peer's law where one window
is in flight, the cap where every draft holds, a case worked by hand, and a simulation of
the loop's windows (each generation of windows one ring latency) agreeing with the sum."""

from __future__ import annotations

import random

import pytest

from meshnet.devtools.speculation_ceiling import depth_limit, pipelined, serial


@pytest.mark.parametrize("drafts", [1, 3, 5, 6])
@pytest.mark.parametrize("p", [0.0, 0.5, 0.8, 0.9, 0.95])
def test_one_window_in_flight_is_the_peers_law(p: float, drafts: int) -> None:
    expected = sum(p ** i for i in range(drafts + 1))  # (1 - p^(k+1)) / (1 - p)
    assert serial(p, drafts).tokens_per_latency == pytest.approx(expected, rel=1e-12)
    assert serial(p, drafts).cap_per_latency == drafts + 1


@pytest.mark.parametrize(("drafts", "windows", "cap"), [(5, 4, 24), (3, 8, 16), (1, 1, 2)])
def test_every_draft_held_reaches_the_cap(drafts: int, windows: int, cap: int) -> None:
    assert depth_limit(drafts, windows) * (drafts + 1) == cap
    assert pipelined(1.0, drafts, windows).tokens_per_latency == cap
    # and approaches it from below as p nears 1
    assert cap * 0.95 < pipelined(0.99999, drafts, windows).tokens_per_latency < cap


def test_no_draft_held_commits_one_token_a_latency() -> None:
    assert pipelined(0.0, 5, 4).tokens_per_latency == 1.0


def test_two_windows_of_one_draft_worked_by_hand() -> None:
    """k = 1, D = 2: generations of 1, 2, 2 ... windows; n = 1, 3, 4, 4 ... drafts (the
    first two start from an answered token). E[tokens] = p/(1-p) + 1 + p (one bonus, after
    the single window); E[generations] = 1 + p + p^4 / (1 - p^4)."""
    p = 0.5
    tokens = p / (1 - p) + 1 + p
    generations = 1 + p + p ** 4 / (1 - p ** 4)
    assert pipelined(p, 1, 2).tokens_per_latency == pytest.approx(tokens / generations)


def simulated(p: float, drafts: int, windows: int, latencies: int, seed: int = 5) -> float:
    """Tokens per latency of the loop's windows, one generation (the windows in flight)
    per latency: every draft holds with probability p; a rejection commits the correction
    and starts over from one window; a generation held whole lets in as many more windows
    as it had (one per window, as loop_pipeline's run counts), up to the depth limit."""
    rng = random.Random(seed)
    most = depth_limit(drafts, windows)
    depth, known, committed = 1, True, 0
    for _ in range(latencies):
        drafted = depth * (drafts + 1) - known
        held = 0
        while held < drafted and rng.random() < p:
            held += 1
        committed += held + 1 if held < drafted else held  # the correction
        if held < drafted:
            depth, known = 1, True
            continue
        known = depth == 1  # one window: its bonus row starts the next from a known token
        committed += known
        depth = min(most, 2 * depth)
    return committed / latencies


@pytest.mark.parametrize(("p", "drafts", "windows"), [(0.5, 5, 4), (0.8, 3, 4), (0.9, 5, 4),
                                                      (0.95, 3, 8)])
def test_the_sum_agrees_with_a_simulation_of_the_windows(p: float, drafts: int,
                                                         windows: int) -> None:
    assert pipelined(p, drafts, windows).tokens_per_latency == pytest.approx(
        simulated(p, drafts, windows, 100_000), rel=0.02)


def test_pipelining_pays_only_where_drafts_hold() -> None:
    assert pipelined(0.5, 5, 4).tokens_per_latency < 1.01 * serial(0.5, 5).tokens_per_latency
    assert pipelined(0.9, 5, 4).tokens_per_latency > 1.2 * serial(0.9, 5).tokens_per_latency


@pytest.mark.parametrize(("p", "drafts", "windows"), [(1.5, 3, 4), (-0.1, 3, 4), (0.5, 0, 4),
                                                      (0.5, 3, 0)])
def test_bad_input_is_refused(p: float, drafts: int, windows: int) -> None:
    with pytest.raises(ValueError, match="need 0 <= p <= 1"):
        pipelined(p, drafts, windows)
