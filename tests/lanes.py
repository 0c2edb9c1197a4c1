"""The lanes a test can run its workers on (the `lanes` fixture of conftest.py gives them)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from _pytest.mark import ParameterSet

from meshnet.local.process import LaunchSpec

# The vulkan lane's step rows that compute each row as alone (patches 0018-0021, on Mesa's
# software device here): its workers share steps of at most that many decode rows.
VULKAN_EXACT_BATCH_ROWS = 8


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


def on_vulkan(*values: object) -> ParameterSet:
    """A test's parameters that put its workers on the vulkan lane: marked `vulkan`, so
    `make test-vulkan` (part of `make test`) runs them once the lane is built."""
    return pytest.param(*values, marks=pytest.mark.vulkan)
