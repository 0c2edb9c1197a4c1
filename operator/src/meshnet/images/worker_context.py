"""A worker image's build context: the lane's portable worker bundle (`meshnet pin build
--portable`, `meshnet worker build --portable`, `meshnet worker bundle`, each cached) and
what the lane needs at run time that Debian does not carry: the vulkan lane's pinned
software device, the CUDA lane's runtime libraries."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from meshnet.images.cuda_runtime import add_cuda_runtime, refuse_build_only
from meshnet.images.vulkan_device import add_software_device
from meshnet.native.build import build_worker
from meshnet.native.bundle import bundle_worker
from meshnet.paths import workspace
from meshnet.pin.build import build, build_dir_for
from meshnet.pin.manifest import load_manifest
from meshnet.pin.workspace import Workspace

Say = Callable[[str], None]


def portable_built(root: Path, lane: str) -> bool:
    """Whether the lane's portable llama.cpp is built here (its worker is minutes more)."""
    manifest = load_manifest(root / "llama-pin.yaml")
    return (build_dir_for(manifest, lane, portable=True) / "complete.json").is_file()


def worker_context(root: Path, lane: str, out: Path, jobs: int | None, say: Say) -> None:
    """Writes the context to `out`: bin/, lib/ and BUNDLE.json of the bundle, share/ of the
    lane's additions (each replaced)."""
    manifest = load_manifest(root / "llama-pin.yaml")
    ws = Workspace(workspace(root))
    build(manifest, ws, lane, say, jobs=jobs, portable=True)
    worker = build_worker(root, manifest, ws, lane, say, jobs=jobs, portable=True)
    shutil.rmtree(out / "share", ignore_errors=True)  # before the bundle lists its files
    bundle_worker(worker, build_dir_for(manifest, lane, portable=True) / "install", out, lane,
                  manifest.digest(), say)
    (out / "share").mkdir()
    if lane == "vulkan":
        add_software_device(manifest, out, say)
    elif lane == "cuda":
        add_cuda_runtime(out, say)
    refuse_build_only(out)
