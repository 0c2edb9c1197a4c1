"""Where things live: the repository, its ignored workspace, and the build cache."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def repo_root() -> Path:
    """The checkout holding `llama-pin.yaml` (MESHNET_REPO overrides the search)."""
    override = os.environ.get("MESHNET_REPO")
    if override:
        return Path(override).resolve()
    for candidate in [Path.cwd(), *Path.cwd().parents, *Path(__file__).resolve().parents]:
        if (candidate / "llama-pin.yaml").is_file():
            return candidate
    raise FileNotFoundError(
        "llama-pin.yaml not found: run inside the meshnet checkout or set MESHNET_REPO"
    )


def workspace(root: Path | None = None) -> Path:
    """The ignored workspace for fetched and built third-party code."""
    override = os.environ.get("MESHNET_WORKSPACE")
    return Path(override) if override else (root or repo_root()) / ".work"


def cache_dir() -> Path:
    """Build cache shared by every checkout on this machine (~/.cache/meshnet)."""
    override = os.environ.get("MESHNET_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meshnet"


def software_device_icd() -> Path:
    """The Vulkan driver manifest (ICD) of the vulkan lane's pinned software device, written
    by `meshnet pin build --lane vulkan` (pin/software_device.py; local/vulkan.py reads it)."""
    return cache_dir() / "vulkan" / "software_device_icd.json"


@contextmanager
def cache_entry_lock(entry: Path) -> Iterator[None]:
    """Holds `entry`'s lock (a file beside it): two builds of one cache key (two checkouts,
    or `make` run twice at once) take turns instead of configuring one tree over the other."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f"{entry.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield
