"""What a lane's llama.cpp build needs beyond CMake options: Debian packages on this
system (checked, never installed here: scripts/install-system-deps.sh LANE installs them),
packages unpacked privately (pin/debian.py), and the tools whose version shapes the build."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from meshnet.errors import PinError
from meshnet.pin import cuda
from meshnet.pin.debian import unpacked
from meshnet.pin.manifest import PinManifest

Say = Callable[[str], None]

# Installed on the system by `scripts/install-system-deps.sh vulkan` (root): the shader
# compiler, SPIR-V headers and the loader the build uses, Mesa's software device
# (lavapipe) that runs it where there is no GPU, and vulkaninfo, which finds that device
# (local/vulkan.py).
SYSTEM_PACKAGES: dict[str, list[str]] = {
    "vulkan": ["glslc", "libvulkan-dev", "spirv-headers", "mesa-vulkan-drivers",
               "vulkan-tools"],
}
# Tools whose version enters the lane's build key: glslc compiles the shaders it embeds.
KEYED_TOOLS: dict[str, list[str]] = {"vulkan": ["glslc"]}


def check_system(lane: str) -> None:
    """PinError naming the missing Debian packages and how to install them."""
    if not shutil.which("dpkg-query"):  # not Debian: CMake says what it cannot find
        return
    missing = [pkg for pkg in SYSTEM_PACKAGES.get(lane, []) if not _installed(pkg)]
    if missing:
        raise PinError(f"the {lane} lane needs Debian packages {', '.join(missing)}: run "
                       f"`sudo bash scripts/install-system-deps.sh {lane}` "
                       f"(or `make deps LANE={lane}`)")


def tool_versions(lane: str) -> dict[str, str]:
    """The first line of each keyed tool's --version ('' where it is missing)."""
    versions = {}
    for tool in KEYED_TOOLS.get(lane, []):
        path = shutil.which(tool)
        out = subprocess.run([path, "--version"], capture_output=True, text=True) if path else None
        versions[tool] = out.stdout.splitlines()[0] if out and out.stdout else ""
    return versions


def lane_cmake_options(manifest: PinManifest, lane: str, say: Say) -> list[str]:
    """The lane's options that point into private prefixes (fetched on first use)."""
    if lane == "cuda":  # toolkit, cuBLAS and the driver stub: pin/cuda.py
        return cuda.cmake_options(say)
    if lane != "vulkan" or not manifest.lane_packages.get(lane):
        return []
    headers = [unpacked(package, say) for package in manifest.lane_packages[lane]]
    return [f"-DVulkan_INCLUDE_DIR={headers[0] / 'usr' / 'include'}"]


def _installed(package: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                         capture_output=True, text=True)
    return out.returncode == 0 and "install ok installed" in out.stdout
