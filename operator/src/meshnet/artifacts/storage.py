"""Where an artifact may be written, and whether it fits there."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from meshnet.errors import StorageRefused

FORBIDDEN_ROOT = Path("/home")
# Room for checkpoints, markers and filesystem overhead beyond the payload.
HEADROOM_BYTES = 64 << 20


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def refuse_home(dest: Path) -> None:
    """No model artifact is ever placed under /home (docs/architecture.md), through
    symlinks neither."""
    lexical = Path(os.path.abspath(dest))
    resolved = dest.resolve()
    if _under(lexical, FORBIDDEN_ROOT) or _under(resolved, FORBIDDEN_ROOT):
        via = f" (it resolves to {resolved})" if resolved != lexical else ""
        raise StorageRefused(
            f"destination {dest}{via} is under {FORBIDDEN_ROOT}: model artifacts are never "
            "placed there; use a PVC or another host path"
        )


def free_bytes(dest: Path) -> int:
    """Free space on the filesystem that holds (or will hold) `dest`."""
    probe = dest
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_space(dest: Path, needed: int, free: int | None = None) -> None:
    available = free_bytes(dest) if free is None else free
    if needed + HEADROOM_BYTES > available:
        raise StorageRefused(
            f"not enough space at {dest}: {needed:,} bytes still to write "
            f"(+{HEADROOM_BYTES >> 20} MiB headroom) but {available:,} free"
        )


@contextmanager
def exclusive(lock_file: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold an exclusive lock on `lock_file`, waiting (after `on_wait()`) while another
    process holds it. A Job pod retried while its predecessor still terminates must not
    write the same partials; the kernel drops the lock when its holder dies, even by SIGKILL.
    """
    fd = os.open(lock_file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
