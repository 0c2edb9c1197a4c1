"""The portable build's identity and flags: the same key on any CPU, its own cache, and
each CPU module built with exactly its variant's instruction sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.errors import PinError
from meshnet.pin import build as pin_build
from meshnet.pin.manifest import load_manifest
from meshnet.pin.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]


def test_the_portable_key_ignores_the_build_hosts_cpu_and_the_native_key_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = load_manifest(REPO / "llama-pin.yaml")
    keys = []
    for flags in ("flags : avx2", "flags : avx512f"):
        monkeypatch.setattr(pin_build, "cpu_features", lambda flags=flags: flags)
        keys.append((pin_build.build_key(manifest, "cpu"),
                     pin_build.build_key(manifest, "cpu", portable=True)))

    (native_a, portable_a), (native_b, portable_b) = keys
    assert native_a != native_b
    assert portable_a == portable_b != native_a


def test_portable_builds_are_cached_apart_from_the_dev_build(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MESHNET_CACHE", str(tmp_path))
    manifest = load_manifest(REPO / "llama-pin.yaml")

    assert pin_build.build_dir_for(manifest, "cuda", portable=True).parent == \
        tmp_path / "portable" / "llama"
    assert pin_build.build_dir_for(manifest, "cuda").parent == tmp_path / "llama"


def test_each_cpu_module_turns_on_only_its_own_instruction_sets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pin_build.platform, "machine", lambda: "x86_64")
    flags = {name: pin_build._feature_flags(features)
             for name, features in pin_build.cpu_variants().items()}

    assert "-DGGML_AVX=OFF" in flags["x64"] and "-DGGML_SSE42=OFF" in flags["x64"]
    assert {"-DGGML_AVX2=ON", "-DGGML_F16C=ON", "-DGGML_FMA=ON", "-DGGML_AVX512=OFF"} <= \
        set(flags["haswell"])
    assert "-DGGML_AVX512=ON" in flags["skylakex"] and "-DGGML_AVX512_VNNI=OFF" in \
        flags["skylakex"]
    assert all(len(f) == len(pin_build.X86_FEATURES) for f in flags.values())


def test_a_lane_without_a_portable_recipe_is_refused(tmp_path: Path) -> None:
    manifest = load_manifest(REPO / "llama-pin.yaml")

    with pytest.raises(PinError, match="unknown portable lane 'metal'"):
        pin_build.build(manifest, Workspace(tmp_path), "metal", print, portable=True)
