"""Verified markers and the destination's own state folder (`DEST/.meshnet/`).

A marker says "this file, with this size and mtime, hashed to this sha256": a later
pull or verify skips the file while the marker still matches the manifest and the file.
Size and mtime are all it checks: bytes changed in place with the mtime put back pass
until a full re-hash (`--full`).

Every path here stays inside the destination: manifest names must be plain file names,
and files of ours are opened without following a symbolic link found in their place.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from meshnet.artifacts.spec import ArtifactFile
from meshnet.errors import ArtifactSpecError, StorageRefused

STATE_DIR = ".meshnet"


def check_file_names(names: Iterable[str]) -> None:
    """Refuse a manifest name that would lead outside the destination (or into our state)."""
    for name in names:
        if not name or name in (".", "..", STATE_DIR) or any(c in name for c in "/\\\0"):
            raise ArtifactSpecError(
                f"file name {name!r} is not a plain file name: a manifest names files inside"
                f" the destination (no path separators, not '.', '..' or {STATE_DIR!r})"
            )


@dataclass(frozen=True)
class Layout:
    """Where a destination keeps each file, its partial, checkpoint and marker."""

    dest: Path

    @property
    def state(self) -> Path:
        return self.dest / STATE_DIR

    def final(self, name: str) -> Path:
        check_file_names([name])
        return self.dest / name

    def partial(self, name: str) -> Path:
        return self.final(name).with_name(f"{name}.partial")

    def journal(self, name: str) -> Path:
        check_file_names([name])
        return self.state / f"{name}.journal"

    def marker(self, name: str) -> Path:
        check_file_names([name])
        return self.state / f"{name}.verified"

    def quarantine(self, name: str) -> Path:
        check_file_names([name])
        return self.state / "quarantine" / name


def marker_matches(marker: dict[str, object], file: ArtifactFile, stat: os.stat_result) -> bool:
    return (
        marker.get("sha256") == file.sha256
        and marker.get("size") == file.size == stat.st_size
        and marker.get("mtimeNs") == stat.st_mtime_ns
    )


def has_valid_marker(layout: Layout, file: ArtifactFile) -> bool:
    try:
        info = layout.final(file.name).lstat()  # a symbolic link may lead anywhere
        marker = json.loads(layout.marker(file.name).read_text())
    except (OSError, ValueError):
        return False
    return (stat.S_ISREG(info.st_mode) and isinstance(marker, dict)
            and marker_matches(marker, file, info))


def marked_sha256(layout: Layout, name: str) -> str | None:
    """The sha256 the marker of `name` vouches for while it matches the file's size and
    mtime, else None."""
    try:
        info = layout.final(name).lstat()
        marker = json.loads(layout.marker(name).read_text())
    except (OSError, ValueError):
        return None
    if not (stat.S_ISREG(info.st_mode) and isinstance(marker, dict)
            and marker.get("size") == info.st_size and marker.get("mtimeNs") == info.st_mtime_ns):
        return None
    return str(marker.get("sha256"))


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
        make_private_dir(layout.state)
        write_atomic(layout.marker(file.name), json.dumps(marker, sort_keys=True) + "\n")
    except (OSError, StorageRefused):
        return False
    return True


def make_private_dir(path: Path) -> None:
    """Create a folder of ours, refusing one that is a symbolic link (it could lead anywhere)."""
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise StorageRefused(f"{path} is a symbolic link or not a folder: refusing to write there")


def open_new(path: Path, mode: str = "w+b") -> IO[Any]:
    """A new, empty file at `path`. Whatever was there is removed first; a symbolic link is
    removed, never followed, and O_EXCL fails rather than follow one planted meanwhile."""
    with suppress(FileNotFoundError):
        path.unlink()
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    return os.fdopen(os.open(path, flags, 0o644), mode)


def open_existing(path: Path, mode: str) -> IO[Any]:
    """An existing regular file of one name, opened for writing ("r+b" or "a") without
    following links: a hard link planted there would make the writes land in another file."""
    flags = os.O_NOFOLLOW | (os.O_WRONLY | os.O_APPEND if mode.startswith("a") else os.O_RDWR)
    fd = os.open(path, flags)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise StorageRefused(f"{path} is not a regular file of one name: refusing to write to it")
    return os.fdopen(fd, mode)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open_new(tmp, "w") as handle:
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
