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


ICD = "/cache/vulkan/software_device_icd.json"


@pytest.mark.parametrize(("types", "environ", "pinned", "expected"), [
    (("CPU",), {}, False, {"GGML_VK_VISIBLE_DEVICES": "0"}),
    (("CPU",), {}, True, {"GGML_VK_VISIBLE_DEVICES": "0", "VK_DRIVER_FILES": ICD}),
    (("DISCRETE_GPU", "CPU"), {}, True, {}),  # ggml-vulkan picks the GPU itself
    (("CPU",), {"GGML_VK_VISIBLE_DEVICES": "1"}, True, {"VK_DRIVER_FILES": ICD}),  # chose one
    (("CPU",), {"VK_ICD_FILENAMES": "/mine.json"}, True, {"GGML_VK_VISIBLE_DEVICES": "0"}),
    ((), {}, True, {}),  # no Vulkan here (or no vulkaninfo)
])
def test_the_software_device_is_named_only_where_it_is_the_only_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, types: tuple[str, ...],
        environ: dict[str, str], pinned: bool, expected: dict[str, str]) -> None:
    """...and the lane's pinned lavapipe is given once `meshnet pin build --lane vulkan` has
    unpacked it, unless the caller chose a driver."""
    icd = tmp_path / "software_device_icd.json"
    if pinned:
        icd.write_text("{}")
    monkeypatch.setattr(vulkan, "host_device_types", lambda: types)
    monkeypatch.setattr(vulkan, "software_device_icd", lambda: icd)
    expected = {k: str(icd) if v == ICD else v for k, v in expected.items()}
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
