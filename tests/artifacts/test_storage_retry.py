"""Destination rules (never /home, enough space) and the retry backoff."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from meshnet.artifacts.retry import RetryPolicy
from meshnet.artifacts.storage import HEADROOM_BYTES, check_space, refuse_home
from meshnet.errors import StorageRefused


@pytest.mark.parametrize("dest", ["/home", "/home/alice/models", "/home/../home/x",
                                  "/var/../home/bob"])
def test_any_destination_under_home_is_refused(dest):
    with pytest.raises(StorageRefused, match="/home"):
        refuse_home(Path(dest))


@pytest.mark.parametrize("dest", ["/var/lib/meshnet/models", "/homework", "/mnt/home"])
def test_destinations_outside_home_are_allowed(dest):
    refuse_home(Path(dest))


def test_a_symlink_into_home_is_refused(tmp_path):
    (tmp_path / "models").symlink_to("/home/someone")

    with pytest.raises(StorageRefused, match="resolves to /home/someone"):
        refuse_home(tmp_path / "models" / "smollm2")


def test_space_check_counts_the_headroom():
    check_space(Path("/tmp"), needed=100, free=100 + HEADROOM_BYTES)
    with pytest.raises(StorageRefused, match="not enough space"):
        check_space(Path("/tmp"), needed=101, free=100 + HEADROOM_BYTES)


def test_space_check_reads_the_filesystem_of_a_folder_not_created_yet(tmp_path):
    check_space(tmp_path / "a" / "b", needed=0)


def test_backoff_is_jittered_and_capped():
    policy = RetryPolicy(base_seconds=1.0, cap_seconds=8.0)
    rng = random.Random(0)

    delays = [[policy.delay(n, rng) for _ in range(200)] for n in (1, 2, 3, 10)]

    assert all(0 <= d <= 1.0 for d in delays[0])
    assert all(0 <= d <= 2.0 for d in delays[1])
    assert all(0 <= d <= 8.0 for d in delays[3]) and max(delays[3]) > 4.0
    assert len(set(delays[2])) > 100  # jittered, not a fixed schedule


def test_retries_are_bounded():
    policy = RetryPolicy(max_attempts=3)

    assert not policy.exhausted(2) and policy.exhausted(3)
