"""CMake build of the patched llama.cpp, cached under ~/.cache/meshnet by input digest.

Two flavours: the dev build (static, tuned to this machine's CPU with GGML_NATIVE: fast
here, may crash on another CPU) and the portable build that images ship (shared
libraries, ggml's CPU backend as one loadable module per CPU generation, picked at run
time by what the CPU supports; cached under ~/.cache/meshnet/portable/).
"""

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

from meshnet.buildsteps.cache import prune
from meshnet.buildsteps.cmake import generator_args, run_logged
from meshnet.errors import PinError
from meshnet.paths import cache_dir, cache_entry_lock
from meshnet.pin import cuda, software_device
from meshnet.pin.lanes import KEYED_TOOLS, check_system, lane_cmake_options, tool_versions
from meshnet.pin.manifest import PinManifest
from meshnet.pin.patch import applied_state
from meshnet.pin.workspace import Workspace

Say = Callable[[str], None]

LANE_OPTIONS: dict[str, list[str]] = {
    "cpu": [],
    # One GPU generation keeps a cold build within reach of 2 cores: Hopper (H100/H200,
    # as code and as PTX that newer GPUs compile when they load it); the portable build
    # below carries the chart's others.
    "cuda": ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"],
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
# A GPU lane builds only what the worker links: the reference tools come from the CPU
# lane's build, and leaving them (and llama-common, mtmd) out saves about 30% of a GPU
# lane's compile (its ninja log), which a cold `make test` pays for.
GPU_LANE_ONLY_OPTIONS = ["-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_COMMON=OFF"]
GPU_LANE_TARGETS = ["llama"]

# The portable build: only the libraries the worker links, shared, with ggml's backends as
# modules (GGML_BACKEND_DL) that ggml loads from beside the executable at run time.
PORTABLE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_BACKEND_DL=ON",
]
PORTABLE_TARGETS = ["llama"]
# The GPU architectures each portable GPU build carries (the chart README says which GPUs
# that is). CUDA: Ampere A100/A30 (80), Ampere A10/A40/RTX 30 (86), Ada L4/L40S/RTX 40
# (89), Hopper H100/H200 as code and as PTX that newer GPUs compile when they load it (90).
PORTABLE_LANE_OPTIONS: dict[str, list[str]] = {
    "cpu": [],
    "cuda": ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=80-real;86-real;89-real;90"],
    "rocm": ["-DGGML_HIP=ON", "-DGPU_TARGETS=gfx90a;gfx942"],  # MI200 (MI210/MI250), MI300
    "vulkan": ["-DGGML_VULKAN=ON"],
}
# x86 CPU generations the portable CPU backend is built for, by ggml's own names and
# feature sets (ggml/src/CMakeLists.txt, GGML_CPU_ALL_VARIANTS): ggml scores each module
# against the CPU and loads the best one. Three rather than ggml's fourteen keep a cold
# build short: x64 runs anywhere, haswell is where our AVX2/F16C/FMA kernels (patches
# 0006-0008) live, skylakex adds AVX-512. MESHNET_CPU_VARIANT=<name> forces one.
X86_FEATURES = ["SSE42", "AVX", "AVX2", "BMI2", "AVX_VNNI", "FMA", "F16C", "AVX512",
                "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8", "AMX_BF16"]
CPU_VARIANTS: dict[str, list[str]] = {
    "x64": [],
    "haswell": ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"],
    "skylakex": ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512"],
}


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


BASELINE = "baseline"


def cpu_variants() -> dict[str, list[str]]:
    """The CPU backend modules of a portable build on this machine's architecture: the x86
    generations, or elsewhere one module with ggml's generic flags for that ISA, kept as
    libggml-cpu.so (ggml's fallback name; MESHNET_CPU_VARIANT has nothing to choose)."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return CPU_VARIANTS
    return {BASELINE: []}


def lane_options(lane: str) -> list[str]:
    """The dev build's CMake options for `lane` (later ones win in CMake)."""
    return COMMON_OPTIONS + LANE_OPTIONS[lane] + ([] if lane == "cpu" else GPU_LANE_ONLY_OPTIONS)


def lane_targets(lane: str) -> list[str]:
    return TARGETS if lane == "cpu" else GPU_LANE_TARGETS


def build_key(manifest: PinManifest, lane: str, portable: bool = False) -> str:
    inputs: dict[str, object] = {
        "pin": manifest.digest(),
        "lane": lane,
        "options": lane_options(lane),
        "targets": lane_targets(lane),
        "compiler": compiler_id(),
        "machine": platform.machine(),
        "cpu": cpu_features(),
    }
    if portable:  # the same bytes whatever CPU builds them: no CPU features in the key
        del inputs["cpu"]
        inputs.update(options=PORTABLE_OPTIONS + PORTABLE_LANE_OPTIONS[lane],
                      targets=PORTABLE_TARGETS, cpu_variants=cpu_variants())
    # Only lanes that have them: the CPU lane's key (and cache) stays what it was.
    if manifest.lane_packages.get(lane):
        inputs["packages"] = [package.sha256 for package in manifest.lane_packages[lane]]
    if KEYED_TOOLS.get(lane):
        inputs["tools"] = tool_versions(lane)
    if lane == "cuda":  # the toolkit and cuBLAS versions, the driver stub
        inputs["cuda"] = cuda.key_inputs()
    blob = json.dumps(inputs, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def build_dir_for(manifest: PinManifest, lane: str, portable: bool = False) -> Path:
    parent = cache_dir() / "portable" / "llama" if portable else cache_dir() / "llama"
    return parent / f"{lane}-{build_key(manifest, lane, portable)}"


def workspace_link(portable: bool, lane: str = "cpu") -> str:
    """The workspace's link to the lane's build; GPU lanes get their own, so a GPU build
    leaves the CPU lane's tools and tests where they were."""
    name = "llama-build-portable" if portable else "llama-build"
    return name if lane == "cpu" else f"{name}-{lane}"


def build(
    manifest: PinManifest, ws: Workspace, lane: str, say: Say, jobs: int | None = None,
    portable: bool = False,
) -> BuildResult:
    """Build (or reuse) the patched tree for `lane`; link it into the workspace."""
    lanes = PORTABLE_LANE_OPTIONS if portable else LANE_OPTIONS
    if lane not in lanes:
        kind = "portable lane" if portable else "lane"
        raise PinError(f"unknown {kind} {lane!r}; choose one of {', '.join(lanes)}")
    if ws.read_marker(ws.patched_marker) != applied_state(manifest):
        raise PinError("the workspace is not patched to the current stack: run `meshnet pin patch`")
    check_system(lane)
    if lane == "vulkan":  # the device its workers run on here: cheap, so on every build
        software_device.install(manifest, say)
    directory = build_dir_for(manifest, lane, portable)
    with cache_entry_lock(directory):
        return _build_locked(manifest, ws, lane, say, jobs, portable, directory)


def _build_locked(manifest: PinManifest, ws: Workspace, lane: str, say: Say, jobs: int | None,
                  portable: bool, directory: Path) -> BuildResult:
    started = time.monotonic()
    key = build_key(manifest, lane, portable)
    done_marker = directory / "complete.json"
    if done_marker.exists():
        ws.link(workspace_link(portable, lane), directory)
        say(f"cache hit: {directory}")
        return BuildResult(key, directory, True, time.monotonic() - started)
    extra = lane_cmake_options(manifest, lane, say)
    if portable:
        return _build_portable(ws, lane, say, jobs or os.cpu_count() or 2, key, directory, started,
                               extra)
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
            *lane_options(lane),
            *extra,
        ],
        log,
        progress=False,
    )
    targets = lane_targets(lane)
    say(f"compiling {', '.join(targets)} with {jobs} jobs (log: {log}) ...")
    run_logged(
        [
            "cmake",
            "--build",
            str(directory / "build"),
            "--parallel",
            str(jobs),
            "--target",
            *targets,
        ],
        log,
        progress=True,
    )
    run_logged(["cmake", "--install", str(directory / "build")], log, progress=False)
    bin_dir = directory / "install" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOL_BINARIES if lane == "cpu" else []:
        shutil.copy2(directory / "build" / "bin" / tool, bin_dir / tool)
    seconds = time.monotonic() - started
    done_marker.write_text(json.dumps({"key": key, "lane": lane, "seconds": round(seconds, 1)}))
    prune(directory.parent)
    ws.link(workspace_link(False, lane), directory)
    say(f"built in {seconds:.0f}s: {directory}")
    return BuildResult(key, directory, False, seconds)


def _build_portable(ws: Workspace, lane: str, say: Say, jobs: int, key: str, directory: Path,
                    started: float, extra: list[str]) -> BuildResult:
    """llama.cpp with the lane's backend, then one CPU module per CPU generation.

    ggml builds either one CPU module (GGML_CPU, flags as given) or all fourteen of its
    x86 variants (GGML_CPU_ALL_VARIANTS); for a few of them we configure the tree again
    once per variant, build only its CPU module (and ggml-base, which it links), and
    install it under the variant's
    name (libggml-cpu-<name>.so) beside the first: that is the layout ggml's loader
    scores and picks from. Each module links the one libggml-base.so the main build
    installs (same sources, same options)."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    log = directory / "build.log"
    variants = cpu_variants()
    first, *others = variants
    prefix = directory / "install"
    say(f"configuring portable llama.cpp ({lane}, CPU modules {', '.join(variants)}) "
        f"in {directory} ...")
    run_logged(
        ["cmake", "-S", str(ws.patched), "-B", str(directory / "build"), *generator_args(),
         f"-DCMAKE_INSTALL_PREFIX={prefix}", *PORTABLE_OPTIONS, *PORTABLE_LANE_OPTIONS[lane],
         *extra, *_feature_flags(variants[first])],
        log, progress=False,
    )
    say(f"compiling {', '.join(PORTABLE_TARGETS)} with {jobs} jobs (log: {log}) ...")
    run_logged(["cmake", "--build", str(directory / "build"), "--parallel", str(jobs),
                "--target", *PORTABLE_TARGETS], log, progress=True)
    run_logged(["cmake", "--install", str(directory / "build")], log, progress=False)
    modules = prefix / "bin"
    if first != BASELINE:  # an x86 variant, scored by ggml like the others
        (modules / "libggml-cpu.so").rename(modules / f"libggml-cpu-{first}.so")
    for name in others:
        variant_dir = directory / "variants" / name
        say(f"compiling the CPU module {name} ({' '.join(variants[name])}) ...")
        run_logged(
            ["cmake", "-S", str(ws.patched), "-B", str(variant_dir), *generator_args(),
             *PORTABLE_OPTIONS, *_feature_flags(variants[name])],
            log, progress=False,
        )
        run_logged(["cmake", "--build", str(variant_dir), "--parallel", str(jobs),
                    "--target", "ggml-cpu"], log, progress=True, label=name)
        shutil.copy2(variant_dir / "bin" / "libggml-cpu.so", modules / f"libggml-cpu-{name}.so")
        shutil.rmtree(variant_dir)  # only its module was wanted
    seconds = time.monotonic() - started
    (directory / "complete.json").write_text(json.dumps(
        {"key": key, "lane": lane, "portable": True, "cpu_variants": list(variants),
         "seconds": round(seconds, 1)}))
    prune(directory.parent)
    ws.link(workspace_link(True, lane), directory)
    say(f"built in {seconds:.0f}s: {directory}")
    return BuildResult(key, directory, False, seconds)


def _feature_flags(enabled: list[str]) -> list[str]:
    """Every x86 instruction-set switch of ggml, on only for `enabled` (GGML_NATIVE=OFF
    would otherwise default several of them on)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    return [f"-DGGML_{feature}={'ON' if feature in enabled else 'OFF'}" for feature in X86_FEATURES]
