"""The CUDA worker image's run-time libraries: the CUDA runtime and cuBLAS, unmodified
from the pinned NVIDIA wheels (pin/cuda.py), each with its wheel's licence, and nothing else
of the toolkit. The driver (libcuda.so.1) is the node's: the NVIDIA container runtime mounts
it. The build-only driver stub, nvcc and ptxas never enter a build context."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from meshnet.images.buildah import ImageError
from meshnet.pin import cuda
from meshnet.pin.cuda import Wheel

Say = Callable[[str], None]
# What ggml's CUDA module loads besides the driver, by soname, per wheel.
LIBRARIES: dict[Wheel, tuple[str, ...]] = {
    cuda.CUDA_RUNTIME: (f"libcudart.so.{cuda.CUDA_MAJOR}",),
    cuda.CUBLAS: (f"libcublas.so.{cuda.CUDA_MAJOR}", f"libcublasLt.so.{cuda.CUDA_MAJOR}"),
}
# Files that must never be in an image: the driver (or the stub standing in for it at
# link time) and the toolkit's compilers.
BUILD_ONLY = re.compile(r"libcuda\.so(\..*)?|nvcc|ptxas")


def runtime_files(prefixes: Mapping[Wheel, Path]) -> dict[Path, Path]:
    """Build-context path -> file, for each wheel unpacked at its prefix: its libraries
    under lib/ (installed to /usr/local/lib) and its licence files under
    share/doc/<wheel>/. ImageError when one is missing."""
    files: dict[Path, Path] = {}
    for wheel, prefix in prefixes.items():
        for soname in LIBRARIES[wheel]:
            library = prefix / "lib" / soname
            if not library.is_file():
                raise ImageError(f"{wheel.package} {wheel.version} has no {soname} in {prefix}")
            files[Path("lib") / soname] = library
        licences = cuda.licence_files(prefix, wheel)
        if not licences:
            raise ImageError(f"{wheel.package} {wheel.version}: no licence file beside {prefix}")
        for licence in licences:
            files[Path("share/doc") / wheel.package / licence.name] = licence
    return files


def add_cuda_runtime(out: Path, say: Say,
                     prefixes: Mapping[Wheel, Path] | None = None) -> dict[Path, Path]:
    """Copies the run-time libraries and licences into the context `out` (the wheels are
    fetched the first time); what it copied."""
    if prefixes is None:
        prefixes = {wheel: cuda.unpacked_wheel(wheel, say) for wheel in LIBRARIES}
    files = runtime_files(prefixes)
    for target, source in files.items():
        (out / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, out / target)  # the bytes as NVIDIA ships them
    return files


def refuse_build_only(context: Path) -> None:
    """ImageError naming every driver, driver stub or compiler in `context`."""
    found = sorted(str(p.relative_to(context)) for p in context.rglob("*")
                   if BUILD_ONLY.fullmatch(p.name))
    if found:
        raise ImageError(f"{context} holds what no image may ship: {', '.join(found)}")
