"""The lanes a test can run its workers on (the `lanes` fixture of conftest.py gives them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from _pytest.mark import ParameterSet

from meshnet.local.process import LaunchSpec

# The GPU lane the tests marked `gpu_lane` run on (as the test lane "gpu"), every layer
# offloaded: vulkan, on Mesa's software Vulkan device where the host has no GPU (`make
# test-vulkan`); on a host with a GPU, MESHNET_TEST_GPU_LANE=cuda (bench/gpu_lane.sh).
GPU_LANES = ("vulkan", "cuda", "rocm")
GPU_LANE = os.environ.get("MESHNET_TEST_GPU_LANE", "vulkan")
if GPU_LANE not in GPU_LANES:
    raise ValueError(f"MESHNET_TEST_GPU_LANE={GPU_LANE}: not one of {', '.join(GPU_LANES)}")

# Step rows that compute each row as alone on the vulkan lane (patches 0018-0021, measured on
# Mesa's software device): GPU lanes' workers share steps of at most that many decode rows
# (a cap: each worker's start-up probe still measures its own device, and may lower it).
GPU_EXACT_BATCH_ROWS = 8


@dataclass(frozen=True)
class Lane:
    """Where a test's workers run: the lane's worker build and, on a GPU lane, every layer
    offloaded (on a host without a GPU, Mesa's software Vulkan device: local/vulkan.py)."""

    name: str
    binary: Path
    gpu_layers: int = 0
    worker_flags: tuple[str, ...] = ()

    def spec(self, spec: LaunchSpec) -> LaunchSpec:
        """`spec` on this lane."""
        return replace(spec, gpu_layers=self.gpu_layers, extra=spec.extra + self.worker_flags)


def on_gpu(*values: object) -> ParameterSet:
    """A test's parameters that put its workers on the GPU lane (the test lane "gpu"):
    marked `gpu_lane`, so `make test-vulkan` (part of `make test`) runs them once the
    vulkan lane is built, and bench/gpu_lane.sh on a GPU's lane."""
    return pytest.param(*values, marks=pytest.mark.gpu_lane)
