"""The local restart policy: the kubelet's backoff, and a budget per window."""

from __future__ import annotations

from meshnet.local.restarts import RestartPolicy


def test_backoff_doubles_up_to_its_cap_and_the_budget_counts_crashes_in_the_window() -> None:
    policy = RestartPolicy(budget=7, window=600)
    delays = [policy.crashed("s1", now=float(t)) for t in range(7)]
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert not policy.exhausted("s1")
    assert not policy.may_start("s1", now=35.0)
    assert policy.may_start("s1", now=36.0)
    policy.crashed("s1", now=40.0)
    assert policy.exhausted("s1")
    assert not policy.may_start("s1", now=10_000.0)  # given up for good
    assert policy.total["s1"] == 8
    assert policy.may_start("s2", now=0.0)  # per stage


def test_crashes_older_than_the_window_no_longer_count() -> None:
    policy = RestartPolicy(budget=1, window=600)
    policy.crashed("s0", now=0.0)
    assert policy.crashed("s0", now=700.0) == 1  # the first one has aged out
    assert not policy.exhausted("s0")
    assert policy.total["s0"] == 2
