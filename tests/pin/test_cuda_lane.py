"""The CUDA lane's build (`make cuda`; too long for `make test` to pay), checked wherever
this machine has built it for the current pin and sources: the worker links, runs its
--help and --print-flags, carries ggml's CUDA backend, keeps the build-only driver stub
out of everything it installs, and refuses clearly where there is no GPU.

A build that was started and did not finish fails here; only one never made on this
machine is skipped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from meshnet.native.build import worker_key
from meshnet.paths import cache_dir
from meshnet.pin import cuda
from meshnet.pin.build import build_dir_for
from meshnet.pin.manifest import load_manifest

from ..cached_builds import finished_build

REPO = Path(__file__).resolve().parents[2]
WORKER = "meshnet-shard-worker"


@pytest.fixture(scope="module")
def llama_build() -> Path:
    return finished_build(build_dir_for(load_manifest(REPO / "llama-pin.yaml"), "cuda"),
                          "CUDA lane's llama.cpp", "make cuda")


@pytest.fixture(scope="module")
def worker_bin(llama_build: Path) -> Path:
    manifest = load_manifest(REPO / "llama-pin.yaml")
    directory = cache_dir() / "worker" / f"cuda-{worker_key(REPO, manifest, 'cuda')}"
    return finished_build(directory, "CUDA lane's worker", "make cuda") / "build" / "bin"


@pytest.fixture(scope="module")
def stub_as_driver(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The build's driver stub under the driver's soname, first on the loader's path: the
    worker loads (where no NVIDIA driver is installed it could not: it links libcuda.so.1)
    and meets a driver that does not work, on any machine, GPU or not."""
    folder = tmp_path_factory.mktemp("stub-as-driver")
    stubs = sorted(cuda.cuda_dir().glob("driver-stub-*/libcuda.so"))
    assert stubs, f"no driver stub under {cuda.cuda_dir()} although the CUDA lane is built"
    (folder / "libcuda.so.1").symlink_to(stubs[-1])
    return {**os.environ, "LD_LIBRARY_PATH": str(folder)}


def _dynamic(binary: Path) -> str:
    return subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True,
                          check=True).stdout


def test_the_cuda_worker_links_the_driver_by_soname_and_runs_help_and_print_flags(
        worker_bin: Path, stub_as_driver: dict[str, str]) -> None:
    worker = worker_bin / WORKER
    assert os.access(worker, os.X_OK), f"{worker} was not linked"
    dynamic = _dynamic(worker)
    assert "[libcuda.so.1]" in dynamic  # the driver's, resolved where the worker runs

    help_text = subprocess.run([str(worker), "--help"], env=stub_as_driver, capture_output=True,
                               text=True, timeout=60)
    assert help_text.returncode == 0, help_text.stderr
    assert "--gpu-layers" in help_text.stdout

    flags = subprocess.run([str(worker), "--print-flags"], env=stub_as_driver, capture_output=True,
                           text=True, timeout=60)
    assert flags.returncode == 0, flags.stderr
    assert "--gpu-layers" in {flag["name"] for flag in json.loads(flags.stdout)}


def test_the_cuda_backend_is_built_in(llama_build: Path, worker_bin: Path) -> None:
    libraries = {p.name for p in (llama_build / "install").rglob("libggml-cuda*")}
    assert libraries, f"no ggml-cuda library in {llama_build / 'install'}"
    symbols = subprocess.run(["nm", "-C", str(worker_bin / WORKER)], capture_output=True,
                             text=True, check=True).stdout
    assert "ggml_backend_cuda_reg" in symbols


def test_the_driver_stub_is_never_installed_nor_found_at_run_time(
        llama_build: Path, worker_bin: Path) -> None:
    for tree in (llama_build / "install", worker_bin):
        assert not [p for p in tree.rglob("libcuda.so*")], f"a libcuda in {tree}"
    # The link put the stub's folder in the run path: it must hold no file the loader
    # would take for the driver.
    for line in _dynamic(worker_bin / WORKER).splitlines():
        if "RUNPATH" in line or "RPATH" in line:
            for folder in line.split("[", 1)[1].rstrip("]").split(":"):
                assert not (Path(folder) / "libcuda.so.1").exists(), folder


def test_without_a_working_driver_the_worker_refuses_with_the_reason(
        worker_bin: Path, stub_as_driver: dict[str, str], smollm2: Path) -> None:
    run = subprocess.run([str(worker_bin / WORKER), "--model", str(smollm2),
                          "--listen", "127.0.0.1:0"], env=stub_as_driver, capture_output=True,
                         text=True, timeout=120)

    assert run.returncode == 1, run.stderr  # refused, not crashed (a signal is negative)
    assert (f"this worker is built for CUDA {cuda.CUDA_MAJOR} (NVIDIA driver "
            f"{cuda.MIN_DRIVER} or newer) and cannot serve here") in run.stderr
    assert "not a working NVIDIA driver" in run.stderr


def test_the_driver_stub_answers_to_the_drivers_soname_but_only_the_linker_finds_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MESHNET_CACHE", str(tmp_path))
    stub = cuda.driver_stub(print)

    assert [p.name for p in stub.parent.glob("libcuda.so*")] == ["libcuda.so"]
    assert "[libcuda.so.1]" in _dynamic(stub)  # its soname: what binaries record as needed
    exported = subprocess.run(["nm", "-D", "--defined-only", str(stub)], capture_output=True,
                              text=True, check=True).stdout.split()
    assert set(cuda.DRIVER_SYMBOLS) <= set(exported)
    assert "cuDriverGetVersion" not in exported  # the worker's check tells it from a driver


def test_on_a_driver_too_old_for_its_cuda_the_worker_refuses_with_both_versions(
        worker_bin: Path, tmp_path: Path, smollm2: Path) -> None:
    # A driver of the 550 branch: it reports CUDA 12.4 as the newest it runs.
    (tmp_path / "driver.c").write_text(
        cuda.stub_source() + "int cuDriverGetVersion(int *v) { *v = 12040; return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                    str(tmp_path / "libcuda.so.1"), str(tmp_path / "driver.c")], check=True)
    run = subprocess.run([str(worker_bin / WORKER), "--model", str(smollm2),
                          "--listen", "127.0.0.1:0"],
                         env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)

    assert run.returncode == 1, run.stderr
    assert (f"built for CUDA {cuda.CUDA_MAJOR} (NVIDIA driver {cuda.MIN_DRIVER} or newer) and "
            "cannot serve here: the NVIDIA driver runs CUDA 12.4 at most") in run.stderr


def test_a_toolkit_with_its_own_cublas_builds_with_it_and_one_without_takes_the_wheel(
        tmp_path: Path) -> None:
    """A GPU machine's full toolkit (no network there to fetch the wheel) against our
    build machines' toolkit of PyPI wheels, which lacks cuBLAS."""
    full, bare = tmp_path / "full", tmp_path / "bare"
    for toolkit in (full, bare):
        (toolkit / "lib64").mkdir(parents=True)
        (toolkit / "include").mkdir()
    (full / "include" / "cublas_v2.h").touch()
    for name in ("libcublas", "libcublasLt"):
        (full / "lib64" / f"{name}.so.13.2.0.9").touch()
        (full / "lib64" / f"{name}.so").symlink_to(f"{name}.so.13.2.0.9")

    assert cuda.toolkit_cublas(full) == (full / "lib64" / "libcublas.so.13.2.0.9").resolve()
    assert cuda.toolkit_cublas(bare) is None
    (bare / "include" / "cublas_v2.h").touch()  # a header without the libraries is not it
    assert cuda.toolkit_cublas(bare) is None


def test_a_cublas_wheel_installed_in_this_python_is_found_where_the_toolkit_has_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch's machines carry cuBLAS as a wheel (namespace package nvidia, cu13/)."""
    prefix = tmp_path / "nvidia" / f"cu{cuda.CUDA_MAJOR}"
    (prefix / "include").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "include" / "cublas_v2.h").touch()
    (prefix / "lib" / f"libcublas.so.{cuda.CUDA_MAJOR}").touch()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cuda.installed_cublas() is None  # without cublasLt it cannot link
    (prefix / "lib" / f"libcublasLt.so.{cuda.CUDA_MAJOR}").touch()
    assert cuda.installed_cublas() == prefix
