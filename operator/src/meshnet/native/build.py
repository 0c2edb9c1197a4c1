"""CMake build of worker/ (shard worker, parity tool, C++ tests) against the pinned llama.cpp.

Cached under ~/.cache/meshnet/worker/ keyed by a digest of worker/ and proto/ sources,
the llama.cpp build key and the compiler; `dev=True` builds incrementally in the
workspace instead, for quick edit-compile loops. `portable=True` builds against the
portable llama.cpp (cached under ~/.cache/meshnet/portable/worker/), for images.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshnet.buildsteps.cache import prune
from meshnet.buildsteps.cmake import BuildError, generator_args, run_logged
from meshnet.paths import cache_dir, cache_entry_lock
from meshnet.pin import cuda
from meshnet.pin.build import build_dir_for, compiler_id
from meshnet.pin.manifest import PinManifest
from meshnet.pin.workspace import Workspace

Say = Callable[[str], None]
SOURCE_DIRS = ("worker", "proto")
SKIPPED_PARTS = {"build", "__pycache__", ".cache"}


@dataclass(frozen=True)
class WorkerBuild:
    directory: Path
    cached: bool
    seconds: float

    @property
    def bin_dir(self) -> Path:
        return self.directory / "build" / "bin"


def source_digest(root: Path) -> str:
    """Digest of every source file under worker/ and proto/ (path + bytes)."""
    digest = hashlib.sha256()
    for top in SOURCE_DIRS:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and not SKIPPED_PARTS.intersection(rel.parts):
                digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def worker_key(root: Path, manifest: PinManifest, lane: str, portable: bool = False) -> str:
    inputs = {
        "sources": source_digest(root),
        "llama": build_dir_for(manifest, lane, portable).name,
        "compiler": compiler_id(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


def build_worker(
    root: Path,
    manifest: PinManifest,
    ws: Workspace,
    lane: str,
    say: Say,
    dev: bool = False,
    jobs: int | None = None,
    portable: bool = False,
) -> WorkerBuild:
    started = time.monotonic()
    llama = build_dir_for(manifest, lane, portable)
    flag = " --portable" if portable else ""
    if not (llama / "complete.json").exists():
        raise BuildError(f"llama.cpp ({lane}{', portable' if portable else ''}) is not built: "
                         f"run `meshnet pin build --lane {lane}{flag}`")
    if dev and portable:
        raise BuildError("a portable worker is a cached build, not a dev build")
    if dev:
        directory = ws.root / f"worker-dev-{lane}"
    else:
        parent = cache_dir() / "portable" / "worker" if portable else cache_dir() / "worker"
        directory = parent / f"{lane}-{worker_key(root, manifest, lane, portable)}"
    # ggml's CMake package looks for the CUDA toolkit again: the same toolkit and stub.
    extra = cuda.cmake_options(say) if lane == "cuda" else []
    with cache_entry_lock(directory):
        return _build_worker_locked(root, llama, ws, say, dev, jobs, directory, started,
                                    worker_link(portable, lane), extra)


def worker_link(portable: bool, lane: str) -> str:
    """The workspace's link to the lane's cached worker; GPU lanes get their own."""
    name = "worker-build-portable" if portable else "worker-build"
    return name if lane == "cpu" else f"{name}-{lane}"


def _build_worker_locked(root: Path, llama: Path, ws: Workspace, say: Say, dev: bool,
                         jobs: int | None, directory: Path, started: float,
                         link: str, extra: list[str]) -> WorkerBuild:
    if not dev:
        if (directory / "complete.json").exists():
            ws.link(link, directory)
            say(f"cache hit: {directory}")
            return WorkerBuild(directory, True, time.monotonic() - started)
        shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    _forget_other_llama(directory, llama)
    log = directory / "build.log"
    log.write_text("")
    jobs = jobs or os.cpu_count() or 2
    say(f"configuring worker/ in {directory} ...")
    run_logged(
        [
            "cmake",
            "-S",
            str(root / "worker"),
            "-B",
            str(directory / "build"),
            *generator_args(),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={llama / 'install'}",
            f"-DMESHNET_PROTO_DIR={root / 'proto'}",
            *extra,
        ],
        log,
        progress=False,
    )
    say(f"compiling worker/ with {jobs} jobs (log: {log}) ...")
    run_logged(
        ["cmake", "--build", str(directory / "build"), "--parallel", str(jobs)],
        log,
        progress=True,
        label="worker",
    )
    seconds = time.monotonic() - started
    (directory / "complete.json").write_text(json.dumps({"seconds": round(seconds, 1)}))
    if not dev:  # the dev build lives in the workspace, not in the cache
        prune(directory.parent)
    ws.link(link, directory)
    say(f"worker built in {seconds:.0f}s: {directory / 'build' / 'bin'}")
    return WorkerBuild(directory, False, seconds)


def _forget_other_llama(directory: Path, llama: Path) -> None:
    """CMake caches the llama.cpp it found (paths of its libraries included), so a dev
    build re-used across pins must be reconfigured from scratch to pick up the new one."""
    stamp = directory / "llama-prefix"
    if not stamp.is_file() or stamp.read_text() != str(llama):
        (directory / "build" / "CMakeCache.txt").unlink(missing_ok=True)
    stamp.write_text(str(llama))


def find_binary(name: str, ws: Workspace, lane: str = "cpu") -> Path:
    """A built worker binary of `lane`; MESHNET_BIN_DIR overrides (e.g. an image's
    /usr/local/bin)."""
    override = os.environ.get("MESHNET_BIN_DIR")
    candidates = [Path(override) / name] if override else []
    candidates.append(ws.root / worker_link(False, lane) / "build" / "bin" / name)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    flag = "" if lane == "cpu" else f" --lane {lane}"
    raise BuildError(f"{name} is not built: run `meshnet worker build{flag}` (or `make build`)")
