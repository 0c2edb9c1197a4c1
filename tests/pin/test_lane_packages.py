"""What a GPU lane's build needs beyond CMake options: Debian packages fetched privately
(pinned by sha256 in llama-pin.yaml) enter only that lane's build key, so the CPU lane's
cached build is untouched; missing system packages are named with the command that
installs them; the Debian archive is the one this system already uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshnet.errors import PinError
from meshnet.pin import build as pin_build
from meshnet.pin import debian, lanes, software_device
from meshnet.pin.manifest import load_manifest

REPO = Path(__file__).resolve().parents[2]


def test_lane_packages_change_only_their_own_lanes_build_key() -> None:
    manifest = load_manifest(REPO / "llama-pin.yaml")
    assert manifest.lane_packages["vulkan"][0].package == "libvulkan-dev"
    without = manifest.model_copy(update={"lane_packages": {}})
    other = manifest.lane_packages["vulkan"][0].model_copy(update={"sha256": "0" * 64})
    changed = manifest.model_copy(update={"lane_packages": {"vulkan": [other]}})

    assert pin_build.build_key(manifest, "cpu") == pin_build.build_key(without, "cpu")
    assert pin_build.build_key(manifest, "cpu", portable=True) == \
        pin_build.build_key(without, "cpu", portable=True)
    assert manifest.digest() == without.digest()  # the recipe identity of every lane too
    assert pin_build.build_key(changed, "vulkan") != pin_build.build_key(manifest, "vulkan")


def test_a_gpu_lanes_build_gets_its_own_workspace_link() -> None:
    assert pin_build.workspace_link(False) == "llama-build"
    assert pin_build.workspace_link(False, "vulkan") == "llama-build-vulkan"
    assert pin_build.workspace_link(True, "vulkan") == "llama-build-portable-vulkan"


def test_a_missing_system_package_is_named_with_its_install_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(lanes.SYSTEM_PACKAGES, "vulkan", ["dpkg", "meshnet-no-such-package"])

    with pytest.raises(PinError, match=r"needs Debian packages meshnet-no-such-package: run "
                                       r"`sudo bash scripts/install-system-deps.sh vulkan`"):
        lanes.check_system("vulkan")
    lanes.check_system("cpu")  # the CPU lane needs none


def test_packages_come_from_the_debian_archive_this_system_uses(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "vendor.sources").write_text(
        "Types: deb\nURIs: https://vendor.example/apt\nSuites: stable\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/vendor.gpg\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    monkeypatch.setattr(debian, "APT_SOURCES", tmp_path)
    monkeypatch.delenv("MESHNET_DEBIAN_MIRROR", raising=False)

    assert debian.debian_mirror() == ("http://mirror.example/debian",
                                      "/usr/share/keyrings/debian-archive-keyring.gpg")

    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text(
        "deb [signed-by=/k.gpg] http://old.example/debian bookworm main contrib\n")
    assert debian.debian_mirror() == ("http://old.example/debian", "/k.gpg")

    (tmp_path / "sources.list").unlink()
    with pytest.raises(PinError, match="MESHNET_DEBIAN_MIRROR"):
        debian.debian_mirror()
    monkeypatch.setenv("MESHNET_DEBIAN_MIRROR", "http://set.example/debian")
    assert debian.debian_mirror()[0] == "http://set.example/debian"


def test_the_pinned_software_device_enters_no_build_key() -> None:
    manifest = load_manifest(REPO / "llama-pin.yaml")
    assert manifest.device_packages["vulkan"][0].package == "mesa-vulkan-drivers"
    without = manifest.model_copy(update={"device_packages": {}})
    for lane in ("cpu", "vulkan"):
        assert pin_build.build_key(manifest, lane) == pin_build.build_key(without, lane)
    assert manifest.digest() == without.digest()


def test_the_software_devices_driver_manifest_names_the_unpacked_driver(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The package's own manifest names its driver by bare name (the system's library path);
    ours names the unpacked one by absolute path, or the build says what is missing."""
    root = tmp_path / "root"
    monkeypatch.setattr(software_device, "unpacked", lambda package, say: root)
    monkeypatch.setattr(software_device.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("MESHNET_CACHE", str(tmp_path / "cache"))
    manifest = load_manifest(REPO / "llama-pin.yaml")
    with pytest.raises(PinError, match=r"holds no libvulkan_lvp\.so"):
        software_device.install(manifest, print)

    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libvulkan_lvp.so").write_bytes(b"")
    (root / "usr/share/vulkan/icd.d").mkdir(parents=True)
    (root / "usr/share/vulkan/icd.d/lvp_icd.json").write_text(json.dumps(
        {"file_format_version": "1.0.0",
         "ICD": {"library_path": "libvulkan_lvp.so", "api_version": "1.4.305"}}))
    icd = software_device.install(manifest, print)

    assert icd == tmp_path / "cache" / "vulkan" / "software_device_icd.json"
    assert json.loads(icd.read_text())["ICD"] == {
        "library_path": str(root / "usr/lib/x86_64-linux-gnu/libvulkan_lvp.so"),
        "api_version": "1.4.305"}
    assert software_device.install(manifest.model_copy(update={"device_packages": {}}),
                                   print) is None


def test_another_architecture_keeps_the_systems_software_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned package's sha256 is amd64's: elsewhere nothing is fetched."""
    monkeypatch.setattr(software_device.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(software_device, "unpacked", lambda package, say: pytest.fail("fetched"))
    said: list[str] = []
    assert software_device.install(load_manifest(REPO / "llama-pin.yaml"), said.append) is None
    assert said == ["no pinned software Vulkan device for aarch64: the system's is used"]
