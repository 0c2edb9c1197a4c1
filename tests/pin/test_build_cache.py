"""The build cache keeps a few recent complete builds and drops stale half-builds."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from meshnet.native.cache import prune


def make_build(parent: Path, name: str, complete: bool, age_s: float) -> Path:
    path = parent / name
    path.mkdir(parents=True)
    stamp = time.time() - age_s
    if complete:
        marker = path / "complete.json"
        marker.write_text(json.dumps({}))
        os.utime(marker, (stamp, stamp))
    os.utime(path, (stamp, stamp))
    return path


DAY = 24 * 3600


def test_prune_keeps_the_newest_complete_builds_and_a_running_one(tmp_path: Path) -> None:
    builds = [make_build(tmp_path, f"cpu-{i}", True, age_s=DAY + 100 * i) for i in range(5)]
    running = make_build(tmp_path, "cpu-running", False, age_s=10)
    stale = make_build(tmp_path, "cpu-stale", False, age_s=7200)

    removed = prune(tmp_path, keep=3)

    assert sorted(removed) == sorted([builds[3], builds[4], stale])
    assert all(p.exists() for p in [*builds[:3], running])


def test_prune_keeps_builds_of_today_that_other_checkouts_may_be_testing(tmp_path: Path) -> None:
    today = [make_build(tmp_path, f"cpu-{i}", True, age_s=600 * i) for i in range(5)]
    assert prune(tmp_path, keep=3) == []
    assert all(p.exists() for p in today)
