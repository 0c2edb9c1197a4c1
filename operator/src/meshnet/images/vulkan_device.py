"""The vulkan worker image's software Vulkan device, so that it also serves on a node
without a GPU: the lane's pinned Mesa lavapipe (pin/software_device.py unpacks it; bookworm's
own crashes on deepseek4 prefills), a driver manifest naming where the image puts it, and
Mesa's copyright. The manifest lies outside the Vulkan loader's search paths, so a node's
own driver is the one found unless a pod sets VK_DRIVER_FILES to it (and
GGML_VK_VISIBLE_DEVICES=0: ggml-vulkan hides CPU-type devices otherwise)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from meshnet.images.buildah import ImageError
from meshnet.pin import software_device
from meshnet.pin.manifest import PinManifest

Say = Callable[[str], None]
PREFIX = Path("/usr/local")  # where the image installs the context's lib/ and share/
DRIVER = Path("lib/meshnet/vulkan") / software_device.DRIVER
MANIFEST = Path("share/meshnet/vulkan/software_device_icd.json")
COPYRIGHT = Path("share/meshnet/vulkan/copyright")


def add_software_device(manifest: PinManifest, out: Path, say: Say) -> None:
    """Copies the pinned lavapipe, its manifest and Mesa's copyright into the context `out`."""
    host_icd = software_device.install(manifest, say)
    if host_icd is None:
        raise ImageError("no pinned software Vulkan device for this machine's architecture "
                         "(llama-pin.yaml device_packages): the vulkan image is built on x86-64")
    icd = json.loads(host_icd.read_text())
    driver = Path(icd["ICD"]["library_path"])  # <unpacked>/usr/lib/<triplet>/libvulkan_lvp.so
    package = manifest.device_packages["vulkan"][0].package
    copyright_file = driver.parents[2] / "share" / "doc" / package / "copyright"
    for source, target in ((driver, DRIVER), (copyright_file, COPYRIGHT)):
        (out / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, out / target)
    icd["ICD"]["library_path"] = str(PREFIX / DRIVER)
    (out / MANIFEST).write_text(json.dumps(icd, indent=2) + "\n")
