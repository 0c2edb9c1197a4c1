"""CMake build of the patched llama.cpp, cached under ~/.cache/meshnet by input digest."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshnet.errors import PinError
from meshnet.native.cache import prune
from meshnet.native.cmake import generator_args, run_logged
from meshnet.paths import cache_dir
from meshnet.pin.manifest import PinManifest
from meshnet.pin.patch import applied_state
from meshnet.pin.workspace import Workspace

Say = Callable[[str], None]

LANE_OPTIONS: dict[str, list[str]] = {
    "cpu": [],
    "cuda": ["-DGGML_CUDA=ON"],
    "rocm": ["-DGGML_HIP=ON"],
    "vulkan": ["-DGGML_VULKAN=ON"],
    "metal": ["-DGGML_METAL=ON"],
}
# What the worker and our tools link against, plus the reference tools we measure against.
COMMON_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_TOOLS_INSTALL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_RPC=ON",
    "-DGGML_NATIVE=ON",
]
# mtmd only because its install rule is unconditional and `cmake --install` needs it.
TARGETS = ["llama", "llama-common", "mtmd", "llama-gguf-split", "ggml-rpc-server", "llama-bench"]
TOOL_BINARIES = ["llama-gguf-split", "ggml-rpc-server", "llama-bench"]


@dataclass(frozen=True)
class BuildResult:
    key: str
    directory: Path
    cached: bool
    seconds: float

    @property
    def prefix(self) -> Path:
        return self.directory / "install"


def compiler_id() -> str:
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PinError(f"no C++ compiler ({cxx}): install g++ (make setup does)") from exc
    return out.stdout.splitlines()[0]


def cpu_features() -> str:
    """Native builds depend on the CPU's instruction sets, so they enter the cache key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_key(manifest: PinManifest, lane: str) -> str:
    inputs = {
        "pin": manifest.digest(),
        "lane": lane,
        "options": COMMON_OPTIONS + LANE_OPTIONS[lane],
        "targets": TARGETS,
        "compiler": compiler_id(),
        "machine": platform.machine(),
        "cpu": cpu_features(),
    }
    blob = json.dumps(inputs, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def build_dir_for(manifest: PinManifest, lane: str) -> Path:
    return cache_dir() / "llama" / f"{lane}-{build_key(manifest, lane)}"


def build(
    manifest: PinManifest, ws: Workspace, lane: str, say: Say, jobs: int | None = None
) -> BuildResult:
    """Build (or reuse) the patched tree for `lane`; link it into the workspace."""
    if lane not in LANE_OPTIONS:
        raise PinError(f"unknown lane {lane!r}; choose one of {', '.join(LANE_OPTIONS)}")
    if ws.read_marker(ws.patched_marker) != applied_state(manifest):
        raise PinError("the workspace is not patched to the current stack: run `meshnet pin patch`")
    started = time.monotonic()
    key = build_key(manifest, lane)
    directory = build_dir_for(manifest, lane)
    done_marker = directory / "complete.json"
    if done_marker.exists():
        ws.link("llama-build", directory)
        say(f"cache hit: {directory}")
        return BuildResult(key, directory, True, time.monotonic() - started)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    log = directory / "build.log"
    jobs = jobs or os.cpu_count() or 2
    say(f"configuring llama.cpp ({lane}) in {directory} ...")
    run_logged(
        [
            "cmake",
            "-S",
            str(ws.patched),
            "-B",
            str(directory / "build"),
            *generator_args(),
            f"-DCMAKE_INSTALL_PREFIX={directory / 'install'}",
            *COMMON_OPTIONS,
            *LANE_OPTIONS[lane],
        ],
        log,
        progress=False,
    )
    say(f"compiling {', '.join(TARGETS)} with {jobs} jobs (log: {log}) ...")
    run_logged(
        [
            "cmake",
            "--build",
            str(directory / "build"),
            "--parallel",
            str(jobs),
            "--target",
            *TARGETS,
        ],
        log,
        progress=True,
    )
    run_logged(["cmake", "--install", str(directory / "build")], log, progress=False)
    bin_dir = directory / "install" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOL_BINARIES:
        shutil.copy2(directory / "build" / "bin" / tool, bin_dir / tool)
    seconds = time.monotonic() - started
    done_marker.write_text(json.dumps({"key": key, "lane": lane, "seconds": round(seconds, 1)}))
    prune(directory.parent)
    ws.link("llama-build", directory)
    say(f"built in {seconds:.0f}s: {directory}")
    return BuildResult(key, directory, False, seconds)
