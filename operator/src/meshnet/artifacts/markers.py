"""Verified markers and the destination's own state folder (`DEST/.meshnet/`).

A marker says "this file, with this size and mtime, hashed to this sha256": a later
pull or verify skips the file while the marker still matches the manifest and the file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifacts.spec import ArtifactFile

STATE_DIR = ".meshnet"


@dataclass(frozen=True)
class Layout:
    """Where a destination keeps each file, its partial, checkpoint and marker."""

    dest: Path

    @property
    def state(self) -> Path:
        return self.dest / STATE_DIR

    def final(self, name: str) -> Path:
        return self.dest / name

    def partial(self, name: str) -> Path:
        return self.dest / f"{name}.partial"

    def journal(self, name: str) -> Path:
        return self.state / f"{name}.journal"

    def marker(self, name: str) -> Path:
        return self.state / f"{name}.verified"

    def quarantine(self, name: str) -> Path:
        return self.state / "quarantine" / name


def marker_matches(marker: dict[str, object], file: ArtifactFile, stat: os.stat_result) -> bool:
    return (
        marker.get("sha256") == file.sha256
        and marker.get("size") == file.size == stat.st_size
        and marker.get("mtimeNs") == stat.st_mtime_ns
    )


def has_valid_marker(layout: Layout, file: ArtifactFile) -> bool:
    try:
        stat = layout.final(file.name).stat()
        marker = json.loads(layout.marker(file.name).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker_matches(marker, file, stat)


def write_marker(layout: Layout, file: ArtifactFile) -> bool:
    """Record a verified file; False where the destination is read-only (a stage mount)."""
    stat = layout.final(file.name).stat()
    marker = {
        "name": file.name,
        "size": file.size,
        "sha256": file.sha256,
        "mtimeNs": stat.st_mtime_ns,
        "verifiedAt": int(time.time()),
    }
    try:
        layout.state.mkdir(exist_ok=True)
        write_atomic(layout.marker(file.name), json.dumps(marker, sort_keys=True) + "\n")
    except OSError:
        return False
    return True


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
