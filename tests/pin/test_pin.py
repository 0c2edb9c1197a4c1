"""`meshnet pin`: verified fetch, guarded patching, cached builds, and status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from meshnet.pin.build import build_dir_for
from meshnet.pin.gittree import tree_hash
from meshnet.pin.manifest import load_manifest

from .conftest import REPO, Checkout


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", "-C", str(cwd), *args], env=env, check=True, capture_output=True, text=True
    ).stdout


def test_fetch_from_the_sdist_yields_the_pinned_tree(fetched_checkout: Checkout) -> None:
    pin = fetched_checkout.manifest()["upstream"]
    pristine = fetched_checkout.workspace / "llama.cpp-pristine"
    assert (pristine / "include" / "llama.h").is_file()
    assert tree_hash(pristine) == pin["tree"]
    marker = json.loads((fetched_checkout.workspace / "llama.cpp-pristine.json").read_text())
    assert marker["source"].startswith("sdist llama-cpp-python==0.3.36")


def test_a_tree_with_one_changed_byte_is_refused_naming_both_hashes(
    fetched_checkout: Checkout,
) -> None:
    victim = fetched_checkout.workspace / "llama.cpp-pristine" / "src" / "llama.cpp"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.write_bytes(bytes(data))

    result = fetched_checkout.meshnet("pin", "fetch")

    assert result.returncode == 1
    tree = fetched_checkout.manifest()["upstream"]["tree"]
    assert f"expected git tree {tree}, actual " in result.stderr
    assert "Traceback" not in result.stderr


def test_fetch_force_replaces_a_tampered_tree(fetched_checkout: Checkout) -> None:
    victim = fetched_checkout.workspace / "llama.cpp-pristine" / "README.md"
    victim.write_text("tampered")
    result = fetched_checkout.meshnet("pin", "fetch", "--force")
    assert result.returncode == 0, result.stderr
    assert victim.read_text() != "tampered"


def test_a_patch_whose_sha256_differs_from_the_manifest_is_refused(
    fetched_checkout: Checkout,
) -> None:
    patch = fetched_checkout.root / "patches" / "0001-demo.patch"
    patch.write_text("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n")
    data = fetched_checkout.manifest()
    data["patches"] = [{"name": "0001-demo.patch", "sha256": "0" * 64}]
    fetched_checkout.write_manifest(data)

    result = fetched_checkout.meshnet("pin", "patch")

    assert result.returncode == 1
    assert "0001-demo.patch: sha256 mismatch: expected " + "0" * 64 in result.stderr
    assert not (fetched_checkout.workspace / "llama.cpp").exists()


def test_an_exported_patch_applies_onto_a_clean_copy_and_patching_twice_is_safe(
    fetched_checkout: Checkout,
) -> None:
    assert fetched_checkout.meshnet("pin", "patch").returncode == 0
    patched = fetched_checkout.workspace / "llama.cpp"
    (patched / "MESHNET-TEST.txt").write_text("hello from a patch\n")
    git(patched, "add", "MESHNET-TEST.txt")
    git(patched, "commit", "-q", "-m", "Add a marker file\n\nWhy: exercise the stack.")
    exported = fetched_checkout.meshnet("pin", "export-patches")
    assert exported.returncode == 0, exported.stderr
    entries = fetched_checkout.manifest()["patches"]
    assert [e["name"] for e in entries] == ["0001-Add-a-marker-file.patch"]

    # A fresh workspace copy gets the stack applied; a second run changes nothing.
    subprocess.run(["rm", "-rf", str(patched)], check=True)
    first = fetched_checkout.meshnet("pin", "patch")
    assert first.returncode == 0, first.stderr
    assert "applied 1 patches" in first.stderr
    assert (patched / "MESHNET-TEST.txt").read_text() == "hello from a patch\n"
    second = fetched_checkout.meshnet("pin", "patch")
    assert second.returncode == 0
    assert "already applied" in second.stderr
    assert git(patched, "rev-list", "--count", "meshnet-base..HEAD").strip() == "1"


def test_patch_refuses_to_discard_local_commits_without_force(
    fetched_checkout: Checkout,
) -> None:
    assert fetched_checkout.meshnet("pin", "patch").returncode == 0
    patched = fetched_checkout.workspace / "llama.cpp"
    (patched / "README.md").write_text("local edit\n")
    git(patched, "commit", "-qam", "local work")

    refused = fetched_checkout.meshnet("pin", "patch")
    assert refused.returncode == 1
    assert "export-patches" in refused.stderr
    assert fetched_checkout.meshnet("pin", "patch", "--force").returncode == 0
    assert (patched / "README.md").read_text() != "local edit\n"


def test_status_json_reports_the_pin_and_its_patches() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "meshnet.cli", "pin", "status", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    status = json.loads(result.stdout)
    manifest = load_manifest(REPO / "llama-pin.yaml")
    assert status["commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert status["tree"] == "b2da53584951ec8aa40680229509a6646a637560"
    assert [p["name"] for p in status["patches"]] == [p.name for p in manifest.patches]
    assert status["pin_digest"] == manifest.digest()
    assert status["lane"] == "cpu"


def test_a_second_build_of_the_same_inputs_is_a_cache_hit() -> None:
    def build() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "meshnet.cli", "pin", "build"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=3600,
        )

    first = build()  # builds only when `make` has not already
    assert first.returncode == 0, first.stderr
    done = build_dir_for(load_manifest(REPO / "llama-pin.yaml"), "cpu") / "complete.json"
    built = done.stat().st_mtime_ns
    second = build()
    assert second.returncode == 0, second.stderr
    assert "cache hit" in second.stderr
    # nothing configured or compiled again (not a time: a busy machine slows a hit too)
    assert "configuring" not in second.stderr and done.stat().st_mtime_ns == built


def test_the_manifest_rejects_a_malformed_patch_entry(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "llama-pin.yaml").read_text())
    data["patches"] = [{"name": "no-number.patch", "sha256": "xyz"}]
    bad = tmp_path / "llama-pin.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [sys.executable, "-m", "meshnet.cli", "pin", "status"],
        env={**os.environ, "MESHNET_REPO": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "is not a valid pin manifest" in result.stderr
    assert "patches.0.name" in result.stderr


def test_a_stack_that_gained_a_patch_is_reapplied_without_force(
    fetched_checkout: Checkout,
) -> None:
    assert fetched_checkout.meshnet("pin", "patch").returncode == 0
    patched = fetched_checkout.workspace / "llama.cpp"
    (patched / "MESHNET-TEST.txt").write_text("new patch\n")
    git(patched, "add", "MESHNET-TEST.txt")
    git(patched, "commit", "-q", "-m", "Add a marker file")
    assert fetched_checkout.meshnet("pin", "export-patches").returncode == 0
    exported = fetched_checkout.manifest()["patches"]
    # Someone else's checkout: the old (empty) stack applied, then a pull brings the patch.
    data = fetched_checkout.manifest()
    data["patches"] = []
    fetched_checkout.write_manifest(data)
    assert fetched_checkout.meshnet("pin", "patch", "--force").returncode == 0
    data["patches"] = exported
    fetched_checkout.write_manifest(data)

    result = fetched_checkout.meshnet("pin", "patch")

    assert result.returncode == 0, result.stderr
    assert "applied 1 patches" in result.stderr
    assert (patched / "MESHNET-TEST.txt").read_text() == "new patch\n"
