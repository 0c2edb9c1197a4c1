"""The images `meshnet images build` makes, built once per session (cached by their
inputs) and run with `buildah run` in chroot isolation on the host's network: a worker
image serving stages to this host's route driver, the operator image's CLI."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route

REPO = Path(__file__).resolve().parents[2]
BUILDAH = ["buildah", "--storage-driver", "vfs"]
WORKER_USER = "10001:10001"
OPERATOR_USER = "65532:65532"
MODELS = "/models"  # where the host's model directory is mounted, read-only
PROMPT = "The capital of France is"
N_TOKENS = 24
SPLIT = [(0, 15), (15, 30)]  # SmolLM2's 30 layers in two stages


@pytest.fixture(scope="session")
def buildah_ready() -> None:
    """buildah as root; missing, CI fails (the images must be shown to work) and a
    developer's run skips."""
    if shutil.which("buildah") is None or os.geteuid() != 0:
        why = "buildah, run as root, builds and runs the images: `make deps`, then as root"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def build_images(*names: str) -> dict[str, dict[str, Any]]:
    """`meshnet images build --only NAME...`: what it built or found, by image name."""
    result = subprocess.run(
        [sys.executable, "-m", "meshnet.cli", "images", "build",
         *(arg for name in names for arg in ("--only", name)), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-4000:]
    return dict(json.loads(result.stdout))


@pytest.fixture(scope="session")
def images(buildah_ready: None) -> dict[str, dict[str, Any]]:
    """The worker-cpu and operator images (cold: the portable build, the Debian base and
    both images, several minutes; warm: a digest check each)."""
    return build_images("worker-cpu", "operator")


@pytest.fixture(scope="session")
def vulkan_image(buildah_ready: None) -> dict[str, Any]:
    """The worker-vulkan image (cold: the lane's portable build, about 20 minutes here)."""
    return build_images("worker-vulkan")["worker-vulkan"]


class Container:
    """A working container of an image; `command` runs something in it as a process of
    this host (chroot isolation shares its network and pid namespace)."""

    def __init__(self, image: str) -> None:
        self.name = subprocess.run([*BUILDAH, "from", "--pull=never", image], check=True,
                                   capture_output=True, text=True).stdout.strip()

    def command(self, *args: str, user: str | None, env: dict[str, str] | None = None,
                volumes: dict[Path, str] | None = None) -> list[str]:
        """`user` None: the image's own USER."""
        options = ["--isolation", "chroot", "--network", "host"]
        options += ["--user", user] if user else []
        for key, value in (env or {}).items():
            options += ["--env", f"{key}={value}"]
        for host, inside in (volumes or {}).items():
            options += ["--volume", f"{host}:{inside}:ro"]
        return [*BUILDAH, "run", *options, self.name, "--", *args]

    def run(self, *args: str, user: str | None, env: dict[str, str] | None = None,
            volumes: dict[Path, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args, user=user, env=env, volumes=volumes),
                              capture_output=True, text=True, timeout=timeout)

    def rootfs(self) -> Path:
        return Path(subprocess.run([*BUILDAH, "mount", self.name], check=True,
                                   capture_output=True, text=True).stdout.strip())

    def remove(self) -> None:
        subprocess.run([*BUILDAH, "rm", self.name], capture_output=True)


@pytest.fixture(scope="module")
def worker_container(images: dict[str, dict[str, Any]]) -> Iterator[Container]:
    container = Container(images["worker-cpu"]["tag"])
    yield container
    container.remove()


@pytest.fixture(scope="module")
def vulkan_container(vulkan_image: dict[str, Any]) -> Iterator[Container]:
    container = Container(vulkan_image["tag"])
    yield container
    container.remove()


@pytest.fixture(scope="module")
def operator_container(images: dict[str, dict[str, Any]]) -> Iterator[Container]:
    container = Container(images["operator"]["tag"])
    yield container
    container.remove()


def worker_launcher(container: Container, directory: Path, model_dir: Path,
                    env: dict[str, str]) -> Path:
    """An executable that starts the image's worker with the arguments it is given, so
    WorkerProcess and start_route drive it like a host binary (SIGTERM reaches the
    worker through buildah)."""
    launcher = directory / f"worker-in-image-{len(list(directory.glob('worker-in-image-*')))}"
    argv = container.command("/usr/local/bin/meshnet-shard-worker", user=WORKER_USER, env=env,
                             volumes={model_dir: MODELS})
    launcher.write_text("#!/bin/sh\nexec " + " ".join(f"'{a}'" for a in argv) + ' "$@"\n')
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    return launcher


def writable_paths(container: Container, user: str) -> list[str]:
    """What `user` may write on the image's root filesystem (besides the mounts and the
    /run and /etc files buildah itself provides for a run)."""
    result = container.run(
        "find", "/", "-xdev", "(", "-path", "/proc", "-o", "-path", "/sys", "-o", "-path",
        "/dev", "-o", "-path", "/run", ")", "-prune", "-o", "-writable", "!", "-type", "l",
        "-print", user=user)
    return sorted(line for line in result.stdout.splitlines()
                  if line not in ("/etc/hosts", "/etc/resolv.conf", "/etc/hostname"))


def image_stages(container: Container, smollm2: Path, log_dir: Path, env: dict[str, str],
                 gpu_layers: int = 0, flags: tuple[str, ...] = ()) -> list[WorkerProcess]:
    """SmolLM2 in two stages, each a worker process of the image, one thread each."""
    launcher = worker_launcher(container, log_dir, smollm2.parent, env)
    specs = [LaunchSpec(model=Path(MODELS) / smollm2.name, layers=LayerRange(*span),
                        route_id="test/images", threads=1, gpu_layers=gpu_layers, extra=flags,
                        manifest_digest="sha256:" + "0" * 64) for span in SPLIT]
    return start_route(launcher, specs, log_dir, timeout=300)


def generate(stages: list[WorkerProcess]) -> dict[str, Any]:
    """The host's `meshnet generate` through the stages."""
    args = [arg for stage in stages for arg in ("--stage", stage.endpoint)]
    result = subprocess.run(
        [sys.executable, "-m", "meshnet.cli", "generate", *args, "--prompt", PROMPT,
         "--max-tokens", str(N_TOKENS), "--ignore-eos", "--json"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))


def image_reference(container: Container, smollm2: Path, prompt_tokens: list[int],
                    env: dict[str, str], gpu_layers: int = 0) -> list[int]:
    """The unsplit model in the image itself: its reference tool on the same CPU module
    or device."""
    result = container.run(
        "/usr/local/bin/meshnet-reference-generate", "--model", f"{MODELS}/{smollm2.name}",
        "--prompt-tokens", ",".join(map(str, prompt_tokens)), "-n", str(N_TOKENS),
        "--threads", "2", "--gpu-layers", str(gpu_layers), user=WORKER_USER, env=env,
        volumes={smollm2.parent: MODELS}, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return list(json.loads(result.stdout)["tokens"])
