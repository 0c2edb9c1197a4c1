#!/usr/bin/env bash
# Install the Debian packages the build and tests need, only when some are missing.
# Usage: install-system-deps.sh [LANE]; a GPU lane adds its own (cpu, the default, none).
set -euo pipefail
lane="${1:-cpu}"

packages=(
  g++ make cmake ninja-build ccache git pkg-config openssl
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  liblz4-dev  # the worker packs boundaries for slow links (its runtime liblz4-1 is in every Debian base)
  prometheus  # promtool and a real Prometheus for the monitoring tests
  buildah debootstrap  # `make images` and tests/images: images without a container engine
)
# The vulkan lane: the shader compiler, SPIR-V headers and loader its build uses, Mesa's software device
# (lavapipe) that runs it without a GPU, and vulkaninfo, which finds that device. Only for
# that lane: the CPU lane's cold setup stays as it was. (Its newer Vulkan headers are
# fetched privately by `meshnet pin build --lane vulkan`, never installed.)
case "$lane" in
  cpu) ;;
  vulkan) packages+=(glslc libvulkan-dev spirv-headers mesa-vulkan-drivers vulkan-tools) ;;
  *) echo "[deps] no Debian packages known for lane $lane" >&2 ;;
esac
# Debian's own python3 needs python3-venv for `python3 -m venv`; other Pythons bring it.
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  packages+=(python3-venv)
fi

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "[deps] all Debian packages present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "[deps] missing Debian packages: ${missing[*]}" >&2
  echo "[deps] run as root, or: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "[deps] installing: ${missing[*]}"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
