"""What the CUDA worker image's build context takes from NVIDIA's wheels: the runtime
libraries by soname, unmodified, with each wheel's licence, and never the driver, the
build-only driver stub or a compiler, however close by they lie."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.images.buildah import ImageError
from meshnet.images.cuda_runtime import add_cuda_runtime, refuse_build_only, runtime_files
from meshnet.pin import cuda
from meshnet.pin.cuda import Wheel

RUNTIME = {cuda.CUDA_RUNTIME: ["libcudart.so.13", "libcudart_static.a", "libcudadevrt.a"],
           cuda.CUBLAS: ["libcublas.so.13", "libcublasLt.so.13", "libnvblas.so.13"]}
# What a toolkit prefix and the cache beside it also hold.
BUILD_ONLY = ["lib/libcuda.so", "lib/stubs/libcuda.so", "lib/libcuda.so.1", "bin/nvcc",
              "bin/ptxas", "nvvm/bin/cicc"]


def unpacked(tmp_path: Path, wheel: Wheel, libraries: list[str], licence: bool = True) -> Path:
    """A wheel unpacked as pin/cuda.py lays it out, with the build's other files beside."""
    prefix = tmp_path / wheel.package / "nvidia" / "cu13"
    for name in libraries + BUILD_ONLY:
        (prefix / ("" if "/" in name else "lib") / name).parent.mkdir(parents=True, exist_ok=True)
        (prefix / ("" if "/" in name else "lib") / name).write_bytes(name.encode())
    if licence:
        folder = tmp_path / wheel.package / cuda.LICENCES / wheel.package
        folder.mkdir(parents=True)
        (folder / "License.txt").write_text(f"{wheel.package} licence\n")
    return prefix


def test_the_context_takes_the_runtime_libraries_and_licences_and_nothing_build_only(
        tmp_path: Path) -> None:
    prefixes = {wheel: unpacked(tmp_path, wheel, names) for wheel, names in RUNTIME.items()}
    context = tmp_path / "context"

    copied = add_cuda_runtime(context, print, prefixes)

    assert sorted(map(str, copied)) == [
        "lib/libcublas.so.13", "lib/libcublasLt.so.13", "lib/libcudart.so.13",
        "share/doc/nvidia-cublas/License.txt", "share/doc/nvidia-cuda-runtime/License.txt"]
    assert (context / "lib/libcublasLt.so.13").read_bytes() == b"libcublasLt.so.13"
    refuse_build_only(context)  # passes: nothing of the build in it


@pytest.mark.parametrize("intruder", ["lib/libcuda.so", "lib/libcuda.so.1", "bin/nvcc",
                                      "bin/ptxas", "lib/stubs/libcuda.so.580.1"])
def test_a_context_holding_a_driver_stub_or_compiler_is_refused(
        tmp_path: Path, intruder: str) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcudart.so.13").write_bytes(b"")
    (tmp_path / intruder).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / intruder).write_bytes(b"")

    with pytest.raises(ImageError, match=intruder):
        refuse_build_only(tmp_path)


def test_a_wheel_without_its_library_or_licence_is_refused(tmp_path: Path) -> None:
    no_light = unpacked(tmp_path / "a", cuda.CUBLAS, ["libcublas.so.13"])
    no_licence = unpacked(tmp_path / "b", cuda.CUDA_RUNTIME, ["libcudart.so.13"], licence=False)

    with pytest.raises(ImageError, match=r"no libcublasLt\.so\.13"):
        runtime_files({cuda.CUBLAS: no_light})
    with pytest.raises(ImageError, match="no licence"):
        runtime_files({cuda.CUDA_RUNTIME: no_licence})
