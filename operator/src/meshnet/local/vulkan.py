"""Vulkan devices for a Vulkan-lane worker started here. ggml-vulkan uses the host's GPUs
and hides CPU-type devices (Mesa's software device, lavapipe) unless
GGML_VK_VISIBLE_DEVICES names them; on a host with no GPU that device is the one to run
on (tests, benchmarks, a stage started by hand), so the launcher names it, and gives the
worker the lane's pinned lavapipe rather than the system's (pin/software_device.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from functools import cache

from meshnet.paths import software_device_icd

VISIBLE = "GGML_VK_VISIBLE_DEVICES"
# The Vulkan loader's driver selection (the second is its older name).
DRIVER_CHOICE = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")
_DEVICE = re.compile(r"^GPU(\d+):", re.MULTILINE)
_TYPE = re.compile(r"deviceType\s*=\s*PHYSICAL_DEVICE_TYPE_(\w+)")


def device_types(summary: str) -> list[str]:
    """The type of each device (CPU, DISCRETE_GPU, ...) in `vulkaninfo --summary`'s text,
    by device index."""
    blocks = _DEVICE.split(summary)[1:]  # index, text, index, text, ...
    types = []
    for text in blocks[1::2]:
        match = _TYPE.search(text)
        types.append(match[1] if match else "UNKNOWN")
    return types


def software_device_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Where every Vulkan device here is CPU-type: {GGML_VK_VISIBLE_DEVICES: "0"} (the first
    is the one named) and, once `meshnet pin build --lane vulkan` has unpacked it, the
    lane's pinned software device (VK_DRIVER_FILES). {} on a host with a GPU or without
    vulkaninfo (Debian's vulkan-tools); a variable the caller already set is kept."""
    types = host_device_types()
    if not types or not all(kind == "CPU" for kind in types):
        return {}
    env = {} if VISIBLE in environ else {VISIBLE: "0"}
    icd = software_device_icd()
    if not any(name in environ for name in DRIVER_CHOICE) and icd.is_file():
        env[DRIVER_CHOICE[0]] = str(icd)
    return env


@cache
def host_device_types() -> tuple[str, ...]:
    """This host's Vulkan device types, asked once per process."""
    if not shutil.which("vulkaninfo"):
        return ()
    try:
        out = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(device_types(out.stdout))
