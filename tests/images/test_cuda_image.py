"""The CUDA worker image, wherever this machine has the lane's portable build (hours on 2
cores: `meshnet pin build --portable --lane cuda`, never started by `make test`): built and
run on a machine without a GPU, its worker refuses to start, saying that no NVIDIA driver
is there, with exit status 1 and no crash; the image carries the CUDA runtime and cuBLAS
with NVIDIA's licence and none of the toolkit, runs as non-root, with no compiler.

A portable build that was started and did not finish fails here; only one never made on
this machine is skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.pin import cuda
from meshnet.pin.build import build_dir_for
from meshnet.pin.manifest import load_manifest

from ..cached_builds import finished_build
from .conftest import MODELS, REPO, WORKER_USER, Container, build_images, writable_paths


@pytest.fixture(scope="module")
def portable_cuda_build() -> Path:
    return finished_build(
        build_dir_for(load_manifest(REPO / "llama-pin.yaml"), "cuda", portable=True),
        "CUDA lane's portable build", "meshnet pin build --portable --lane cuda")


@pytest.fixture(scope="module")
def cuda_container(portable_cuda_build: Path, buildah_ready: None) -> Iterator[Container]:
    container = Container(build_images("worker-cuda")["worker-cuda"]["tag"])
    yield container
    container.remove()


def test_without_a_gpu_the_cuda_image_refuses_to_start_saying_there_is_no_driver(
        cuda_container: Container, smollm2: Path) -> None:
    result = cuda_container.run(
        "/usr/local/bin/meshnet-shard-worker", "--model", f"{MODELS}/{smollm2.name}",
        "--layers", "0:15", "--listen", "127.0.0.1:0", "--metrics-listen", "",
        "--gpu-layers", "99", user=WORKER_USER, volumes={smollm2.parent: MODELS})

    assert result.returncode == 1, result.stderr[-2000:]  # refused, not crashed
    assert (f"this worker is built for CUDA {cuda.CUDA_MAJOR} (NVIDIA driver {cuda.MIN_DRIVER} "
            "or newer) and cannot serve here: no NVIDIA driver: libcuda.so.1 is not found"
            ) in result.stderr


def test_the_cuda_image_carries_the_runtime_and_its_licence_and_none_of_the_toolkit(
        cuda_container: Container) -> None:
    found = cuda_container.run(
        "find", "/", "-xdev", "(", "-name", "libcuda.so*", "-o", "-name", "nvcc", "-o",
        "-name", "ptxas", "-o", "-name", "libcudart.so*", "-o", "-name", "libcublas*", "-o",
        "-path", "/usr/local/share/doc/nvidia-*", ")", "-print", user=None).stdout.split()
    # What ggml's CUDA module still misses: the driver alone, which the node brings.
    unresolved = cuda_container.run(
        "sh", "-c", "ldd /usr/local/bin/libggml-cuda.so | grep 'not found'", user=None).stdout

    assert sorted(found) == [
        "/usr/local/lib/libcublas.so.13", "/usr/local/lib/libcublasLt.so.13",
        "/usr/local/lib/libcudart.so.13", "/usr/local/share/doc/nvidia-cublas",
        "/usr/local/share/doc/nvidia-cublas/License.txt",
        "/usr/local/share/doc/nvidia-cuda-runtime",
        "/usr/local/share/doc/nvidia-cuda-runtime/License.txt"]
    assert [line.split()[0] for line in unresolved.splitlines()] == ["libcuda.so.1"]


def test_the_cuda_image_runs_as_non_root_with_nothing_to_write_and_no_compiler(
        cuda_container: Container) -> None:
    shell = cuda_container.run("sh", "-c", "id -u; for c in cc gcc g++ c++ clang cmake make; "
                               "do command -v $c; done; true", user=None)
    uid, *rest = shell.stdout.split("\n")

    assert uid == WORKER_USER.split(":")[0]
    assert [line for line in rest if line] == []
    assert set(writable_paths(cuda_container, WORKER_USER)) <= {"/tmp", "/var/tmp"}
