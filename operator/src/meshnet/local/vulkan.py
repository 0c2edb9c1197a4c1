"""Vulkan devices for a Vulkan-lane worker started here. ggml-vulkan uses the host's GPUs
and hides CPU-type devices (Mesa's software device, lavapipe) unless
GGML_VK_VISIBLE_DEVICES names them; on a host with no GPU that device is the one to run
on (tests, benchmarks, a stage started by hand), so the launcher names it."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from functools import cache

VISIBLE = "GGML_VK_VISIBLE_DEVICES"
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
    """{GGML_VK_VISIBLE_DEVICES: "0"} when every Vulkan device here is CPU-type (the first
    is the one named); {} when the caller already chose, when there is a GPU, or when
    vulkaninfo (Debian's vulkan-tools) is missing."""
    if VISIBLE in environ:
        return {}
    types = host_device_types()
    return {VISIBLE: "0"} if types and all(kind == "CPU" for kind in types) else {}


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
