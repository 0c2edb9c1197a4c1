"""What the benches compare on a GPU lane: our kernel paths (patches 0018-0021: one path for
steps of 1..8 rows) against upstream's on the same device and build, which patch 0022
restores in a worker whose environment holds MESHNET_VK_UPSTREAM_PATHS=1 (benches and tests
only), with every layer on the device."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from meshnet.local.process import worker_binary
from meshnet.local.vulkan import host_device_types
from meshnet.reconcile.route.worker_command import OFFLOAD_ALL_LAYERS
from meshnet.route.handshake import StageInfo

LANES = ("cpu", "vulkan", "cuda", "rocm")
# A worker on upstream's paths (its exactness cache keys on both variables, so it measures
# its own steps). ggml-vulkan's fusions are off: the add+rms fusion that 0022 restores
# crashes Mesa's software device (SIGSEGV in the start-up probe of SmolLM2 0:15), so
# upstream runs there without any fusion, slower than upstream itself.
UPSTREAM_PATHS = {"MESHNET_VK_UPSTREAM_PATHS": "1", "GGML_VK_DISABLE_FUSION": "1"}
# name -> the workers' environment
KERNELS: dict[str, dict[str, str]] = {"exact paths": {}, "upstream paths": UPSTREAM_PATHS}


def lane_binary(lane: str, bin_dir: Path | None, name: str = "meshnet-shard-worker") -> Path:
    """The lane's worker: --bin-dir's, else the lane's build (`make vulkan`)."""
    return bin_dir / name if bin_dir else worker_binary(lane=lane, name=name)


def lane_gpu_layers(lane: str) -> int:
    """Every layer on the device on a GPU lane, none on the CPU lane."""
    return 0 if lane == "cpu" else OFFLOAD_ALL_LAYERS


def device_note(lane: str) -> str:
    """What the lane's figures may be compared with."""
    if lane == "cpu":
        return "cpu lane (upstream paths: the same as ours there, 0022 touches ggml-vulkan only)"
    types = host_device_types()
    if types and all(kind == "CPU" for kind in types):
        return (f"{lane} lane, every layer on Mesa's software Vulkan device (no GPU here): the "
                "figures compare setups inside this run only, not with other runs, lanes or "
                "hardware")
    return (f"{lane} lane, every layer on the device ({', '.join(types) or 'unknown'}): the "
            "figures compare setups inside this run, on this device")


def exactness(stages: Sequence[StageInfo]) -> str:
    """What each stage's start-up probe measured (GetInfo), as one short phrase."""
    return "; ".join(
        f"stage {i + 1}: exact step {stage.exact_step_rows} rows, batching "
        f"{'exact' if stage.exact_batching else 'inexact'}"
        f"{' (throughput: shared anyway)' if stage.throughput_batching else ''}"
        for i, stage in enumerate(stages))
