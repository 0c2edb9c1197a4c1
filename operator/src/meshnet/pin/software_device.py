"""The vulkan lane's software device: a pinned Mesa lavapipe (llama-pin.yaml,
`device_packages`), unpacked privately like the lane's headers, and a Vulkan driver manifest
naming it by absolute path. A worker on a host without a GPU is pointed at it
(local/vulkan.py): the device the lane's tests measure is the pinned one, whatever Mesa the
system carries. Nothing is installed."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

from meshnet.errors import PinError
from meshnet.paths import software_device_icd
from meshnet.pin.debian import unpacked
from meshnet.pin.manifest import PinManifest

Say = Callable[[str], None]
DRIVER = "libvulkan_lvp.so"
PINNED_MACHINES = ("x86_64",)  # the architecture whose package llama-pin.yaml pins


def install(manifest: PinManifest, say: Say) -> Path | None:
    """Unpack the lane's pinned software device (fetched the first time) and point the
    driver manifest at it; None where the pin names none for vulkan, or none for this
    machine's architecture (its sha256 is amd64's): workers there keep the system's."""
    packages = manifest.device_packages.get("vulkan", [])
    if not packages:
        return None
    if platform.machine() not in PINNED_MACHINES:
        say(f"no pinned software Vulkan device for {platform.machine()}: the system's is used")
        return None
    root = unpacked(packages[0], say)
    drivers = sorted(root.glob(f"usr/lib/*/{DRIVER}"))
    manifests = sorted(root.glob("usr/share/vulkan/icd.d/lvp_icd*.json"))
    if not drivers or not manifests:
        raise PinError(f"{packages[0].package} {packages[0].version} holds no {DRIVER} and "
                       f"driver manifest under {root}")
    icd = json.loads(manifests[0].read_text())
    icd["ICD"]["library_path"] = str(drivers[0])
    target = software_device_icd()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(icd, indent=2) + "\n")
    scratch.replace(target)
    say(f"software Vulkan device: {packages[0].package} {packages[0].version} ({target})")
    return target
