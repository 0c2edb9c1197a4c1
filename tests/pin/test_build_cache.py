"""The build cache keeps a few recent complete builds and drops stale half-builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from meshnet.buildsteps.cache import prune
from meshnet.paths import cache_entry_lock


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


def test_two_builds_of_one_key_take_turns(tmp_path: Path) -> None:
    """Two checkouts building one key at once once configured one tree over the other and
    both failed: the second now waits for the first and then finds its complete build."""
    entry = tmp_path / "cpu-key"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from meshnet.paths import cache_entry_lock\n"
         "with cache_entry_lock(Path(sys.argv[1])):\n"
         "    print('held', flush=True); time.sleep(1.0)\n"
         "    (Path(sys.argv[1]) / 'complete.json').parent.mkdir(parents=True)\n"
         "    (Path(sys.argv[1]) / 'complete.json').write_text('{}')\n", str(entry)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with cache_entry_lock(entry):
        assert (entry / "complete.json").exists()  # the first build finished before we went on
    assert holder.wait(timeout=30) == 0
