"""A Vulkan-lane stage on a host whose only Vulkan device is Mesa's software one
(lavapipe, which ggml-vulkan hides unless GGML_VK_VISIBLE_DEVICES names it) is given that
device; a host with a GPU, or a caller who chose, is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local import vulkan
from meshnet.local.process import LaunchSpec

LAVAPIPE = """Devices:
========
GPU0:
\tapiVersion         = 1.3.230
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
"""
WITH_GPU = """Devices:
========
GPU0:
\tdeviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
\tdeviceName         = NVIDIA H100 80GB HBM3
GPU1:
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
"""


def test_device_types_are_read_from_vulkaninfos_summary() -> None:
    assert vulkan.device_types(LAVAPIPE) == ["CPU"]
    assert vulkan.device_types(WITH_GPU) == ["DISCRETE_GPU", "CPU"]
    assert vulkan.device_types("") == []


@pytest.mark.parametrize(("types", "environ", "expected"), [
    (("CPU",), {}, {"GGML_VK_VISIBLE_DEVICES": "0"}),
    (("DISCRETE_GPU", "CPU"), {}, {}),  # ggml-vulkan picks the GPU itself
    (("CPU",), {"GGML_VK_VISIBLE_DEVICES": "1"}, {}),  # the caller chose
    ((), {}, {}),  # no Vulkan here (or no vulkaninfo)
])
def test_the_software_device_is_named_only_where_it_is_the_only_one(
        monkeypatch: pytest.MonkeyPatch, types: tuple[str, ...], environ: dict[str, str],
        expected: dict[str, str]) -> None:
    monkeypatch.setattr(vulkan, "host_device_types", lambda: types)
    assert vulkan.software_device_env(environ) == expected


def test_only_a_stage_that_offloads_layers_is_given_the_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vulkan, "host_device_types", lambda: ("CPU",))
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES", raising=False)
    spec = LaunchSpec(model=Path("m.gguf"), layers=LayerRange(0, 30))

    assert "GGML_VK_VISIBLE_DEVICES" not in spec.environment()
    offloading = LaunchSpec(model=Path("m.gguf"), layers=LayerRange(0, 30), gpu_layers=99)
    assert offloading.environment()["GGML_VK_VISIBLE_DEVICES"] == "0"
    assert offloading.environment({"GGML_VK_VISIBLE_DEVICES": "2"})[
        "GGML_VK_VISIBLE_DEVICES"] == "2"
