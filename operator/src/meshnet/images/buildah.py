"""Running buildah the one way that works without a container engine or user namespaces:
as root, with chroot isolation and the vfs storage driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from meshnet.errors import MeshnetError


class ImageError(MeshnetError):
    """buildah or debootstrap is missing, or a step of an image build failed."""


def storage_driver() -> str:
    return os.environ.get("STORAGE_DRIVER", "vfs")


def command(*args: str) -> list[str]:
    """`buildah --storage-driver vfs ARGS`; ImageError when buildah cannot run here."""
    binary = shutil.which("buildah")
    if binary is None:
        raise ImageError("buildah is not installed: run `make deps` (Debian package buildah)")
    if os.geteuid() != 0:
        raise ImageError("buildah without a container engine needs root here (chroot isolation)")
    return [binary, "--storage-driver", storage_driver(), *args]


def environment() -> dict[str, str]:
    return {**os.environ, "BUILDAH_ISOLATION": "chroot"}


def run(*args: str, capture: bool = True, timeout: float | None = None) -> str:
    """One buildah call; its stdout, or ImageError with the end of what it said."""
    result = subprocess.run(command(*args), env=environment(), text=True, timeout=timeout,
                            capture_output=capture)
    if result.returncode != 0:
        said = ((result.stderr or "") + (result.stdout or "")).strip().splitlines()[-25:]
        raise ImageError(f"buildah {args[0]} failed (exit {result.returncode}):\n"
                         + "\n".join(said))
    return result.stdout or ""


def image_info(reference: str) -> dict[str, Any] | None:
    """`buildah inspect` of a local image, or None when the store has none by that name."""
    result = subprocess.run(command("inspect", "--type", "image", reference), env=environment(),
                            text=True, capture_output=True)
    if result.returncode != 0:
        return None
    data = json.loads(result.stdout)
    return data if isinstance(data, dict) else None


def image_labels(reference: str) -> dict[str, str]:
    info = image_info(reference)
    if info is None:
        return {}
    labels = (info.get("OCIv1") or {}).get("config", {}).get("Labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def image_id(reference: str) -> str:
    info = image_info(reference)
    return str(info.get("FromImageID", "")) if info else ""


def remove_if_untagged(image: str) -> None:
    """Drops an image that a rebuild left without a name (nothing else refers to it)."""
    info = image_info(image)
    if info is not None and not str(info.get("FromImage", "")).strip():
        subprocess.run(command("rmi", image), env=environment(), capture_output=True)


def image_size(reference: str) -> int:
    """Bytes of the image as stored (uncompressed layers), from buildah's decimal "125 MB"."""
    for image in json.loads(run("images", "--json", reference) or "[]"):
        number, _, unit = str(image.get("size", "")).partition(" ")
        scale = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}.get(unit)
        try:
            return int(float(number) * scale) if scale else 0
        except ValueError:
            return 0
    return 0
