"""The GPU product of this machine, for lanes run by `meshnet up` (a cluster reads it from
node labels instead). MESHNET_GPU_PRODUCT overrides what is detected."""

from __future__ import annotations

import os
import shutil
import subprocess

from meshnet.api.certification import NO_GPU
from meshnet.certify.lane import UNKNOWN

NVIDIA_QUERY = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]


def local_gpu_product(backend: str) -> str:
    if backend == "cpu":
        return NO_GPU
    if os.environ.get("MESHNET_GPU_PRODUCT"):
        return os.environ["MESHNET_GPU_PRODUCT"]
    if backend not in ("cuda", "vulkan") or shutil.which(NVIDIA_QUERY[0]) is None:
        return UNKNOWN
    try:
        out = subprocess.run(NVIDIA_QUERY, capture_output=True, text=True, timeout=30,
                             check=True)
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    names = {line.strip() for line in out.stdout.splitlines() if line.strip()}
    return "+".join(sorted(names)) or UNKNOWN
