"""Keep the build cache bounded: a few recent complete builds, no stale half-builds."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

KEEP_COMPLETE = 3
STALE_AFTER_S = 3600  # an unfinished build untouched this long is not running any more
# Builds finished this recently are kept beyond `keep`: another checkout (a worktree,
# a CI clone) may be running tests against one right now.
RECENT_S = 24 * 3600


def prune(parent: Path, keep: int = KEEP_COMPLETE, now: float | None = None) -> list[Path]:
    """Remove the complete builds beyond the `keep` newest that finished over a day ago,
    and stale unfinished ones."""
    now = time.time() if now is None else now
    entries = [p for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
    complete = sorted(
        (p for p in entries if (p / "complete.json").exists()),
        key=lambda p: (p / "complete.json").stat().st_mtime,
        reverse=True,
    )
    unfinished = [
        p for p in entries if p not in complete and now - p.stat().st_mtime > STALE_AFTER_S
    ]
    old = [p for p in complete[keep:] if now - (p / "complete.json").stat().st_mtime > RECENT_S]
    removed = old + unfinished
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
