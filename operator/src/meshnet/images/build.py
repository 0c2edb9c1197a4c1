"""Which images `meshnet images build` makes, from what, and the build itself: each image's
build context is assembled under .work/images/<name>/, its inputs (Dockerfile, context,
base image, build arguments) hashed into a label, and a tagged image whose label matches
is not built again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import yaml

from meshnet.images import buildah
from meshnet.images.base import DIGEST_LABEL, ensure_local_base

Say = Callable[[str], None]
CHART = Path("charts/meshnet-shard-operator/Chart.yaml")
# The Debian release every image is built on, by its usual name where a registry has it.
REGISTRY_BASE = "debian:bookworm-slim"
# The Python sources the operator and certify images install (pyproject reads README.md).
PYTHON_SOURCES = ("README.md", "operator", "proto", "llama-pin.yaml")
BUILD_CA = Path("/mnt/meshnet-build-ca.pem")
SKIPPED = {"__pycache__", ".mypy_cache", ".ruff_cache", "_proto", "build"}


@dataclass(frozen=True)
class ImageSpec:
    name: str
    dockerfile: str
    repository: str  # as the chart's defaults name it; the tag is the chart's appVersion
    context: str  # "worker-bundle" or "python-sources"
    needs: tuple[str, ...] = ()  # images built first (their names), passed as build args
    args: dict[str, str] = field(default_factory=dict)
    # The lane whose portable worker bundle a worker image takes (a certify image: its
    # worker's). A GPU lane's image is built by default only where that build exists.
    lane: str = "cpu"


def python_versions() -> dict[str, str]:
    """The code generator and runtime protobuf of this checkout's own environment, so the
    image's generated code is what the tests ran (a newer grpcio-tools writes code that an
    older protobuf refuses at import)."""
    return {"GRPCIO_TOOLS_VERSION": metadata.version("grpcio-tools"),
            "PROTOBUF_VERSION": metadata.version("protobuf")}


IMAGES: dict[str, ImageSpec] = {
    spec.name: spec for spec in (
        ImageSpec("worker-cpu", "images/worker-cpu.Dockerfile",
                  "meshnet/meshnet-shard-worker-cpu", "worker-bundle"),
        ImageSpec("operator", "images/operator.Dockerfile", "meshnet/meshnet-operator",
                  "python-sources"),
        ImageSpec("certify-cpu", "images/certify.Dockerfile", "meshnet/meshnet-certify-cpu",
                  "python-sources", needs=("worker-cpu",)),
        *(spec for lane in ("vulkan", "cuda") for spec in (
            ImageSpec(f"worker-{lane}", f"images/worker-{lane}.Dockerfile",
                      f"meshnet/meshnet-shard-worker-{lane}", "worker-bundle", lane=lane),
            ImageSpec(f"certify-{lane}", "images/certify.Dockerfile",
                      f"meshnet/meshnet-certify-{lane}", "python-sources",
                      needs=(f"worker-{lane}",), lane=lane))),
    )
}


def default_images(built_lanes: Callable[[str], bool]) -> list[str]:
    """What `meshnet images build` makes unless told: the CPU lane's images and the
    operator, and a GPU lane's where its portable build is already there (`built_lanes`
    says): building one takes a GPU lane's whole llama.cpp, so only when asked."""
    return [name for name, spec in IMAGES.items()
            if spec.lane == "cpu" or built_lanes(spec.lane)]


def app_version(root: Path) -> str:
    return str(yaml.safe_load((root / CHART).read_text())["appVersion"])


def tag(root: Path, spec: ImageSpec) -> str:
    return f"{spec.repository}:{app_version(root)}"


def local_name(reference: str) -> str:
    """How buildah stores an unqualified name."""
    return reference if reference.split("/")[0] in ("localhost",) else f"localhost/{reference}"


@dataclass(frozen=True)
class BuiltImage:
    name: str
    tag: str
    digest: str
    size: int
    seconds: float
    cached: bool


def tree_digest(paths: Iterable[Path], base: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        rel = path.relative_to(base)
        digest.update(str(rel).encode() + b"\0")
        digest.update((b"->" + str(path.readlink()).encode()) if path.is_symlink()
                      else path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def python_context(root: Path, out: Path) -> None:
    """The repository files the Python images install, without caches or generated code
    (the image generates its own from proto/)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ignore = shutil.ignore_patterns(*SKIPPED, "*.egg-info", "*.pyc")
    for name in PYTHON_SOURCES:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, out / name, ignore=ignore)
        else:
            shutil.copy2(source, out / name)


def context_files(context: Path) -> list[Path]:
    return [p for p in context.rglob("*") if p.is_file() or p.is_symlink()]


def build_image(root: Path, spec: ImageSpec, context: Path, base: str, pull: str,
                built: dict[str, BuiltImage], say: Say, force: bool = False) -> BuiltImage:
    """Builds `spec` from `context` on `base` unless an image with the same inputs exists."""
    started = time.monotonic()
    reference = tag(root, spec)
    dockerfile = root / spec.dockerfile
    args = {"BASE_IMAGE": base, **spec.args}
    if spec.context == "python-sources":
        args.update(python_versions())
    for need in spec.needs:
        args["WORKER_IMAGE"] = local_name(built[need].tag)
    inputs = {
        "dockerfile": hashlib.sha256(dockerfile.read_bytes()).hexdigest(),
        "context": tree_digest(context_files(context), context),
        "base": buildah.image_id(base) or base,
        "args": args,
        "needs": {need: built[need].digest for need in spec.needs},
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]
    name = local_name(reference)
    if not force and buildah.image_labels(name).get(DIGEST_LABEL) == digest:
        size = buildah.image_size(name)
        say(f"{spec.name}: cached {name} ({size / 1e6:.0f} MB)")
        return BuiltImage(spec.name, reference, digest, size, time.monotonic() - started, True)
    say(f"{spec.name}: building {name} from {spec.dockerfile} ...")
    build_args = [a for key, value in args.items() for a in ("--build-arg", f"{key}={value}")]
    ca = _build_ca(spec, context.parent / f"{spec.name}-ca")
    previous = buildah.image_id(name)
    buildah.run("build", "--isolation", "chroot", f"--pull={pull}", "--network", "host",
                "--label", f"{DIGEST_LABEL}={digest}", *build_args, *ca,
                "-f", str(dockerfile), "-t", reference, str(context))
    if previous and previous != buildah.image_id(name):
        buildah.remove_if_untagged(previous)  # vfs keeps every layer whole: do not pile up
    seconds = time.monotonic() - started
    size = buildah.image_size(name)
    say(f"{spec.name}: built {name} in {seconds:.0f}s ({size / 1e6:.0f} MB)")
    return BuiltImage(spec.name, reference, digest, size, seconds, False)


def _build_ca(spec: ImageSpec, scratch: Path) -> list[str]:
    """The host's CA bundle for pip inside the build, so a TLS-intercepting proxy that the
    host trusts works there too. Mounted for RUN steps only, on /mnt (empty in Debian and
    Ubuntu images) so that no mount point is left behind in the image."""
    if spec.context != "python-sources":
        return []
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            scratch.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(candidate, scratch / BUILD_CA.name)
            return ["--volume", f"{scratch}:{BUILD_CA.parent}:ro",
                    "--build-arg", f"PIP_CERT={BUILD_CA}"]
    return []


def resolve_base(base: str, say: Say) -> tuple[str, str]:
    """The base image to build on and buildah's pull policy for it. `auto`: the usual
    Debian image when the store already holds it, else a local debootstrapped one."""
    if base == "auto":
        base = REGISTRY_BASE if buildah.image_info(REGISTRY_BASE) else "local"
    if base == "local":
        return ensure_local_base(say), "never"
    return base, "false"  # pull only when missing


def order(names: Iterable[str]) -> list[str]:
    """The images asked for and the ones they need, needed ones first."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        for need in IMAGES[name].needs:
            visit(need)
        if name not in ordered:
            ordered.append(name)

    for name in names:
        visit(name)
    return ordered
