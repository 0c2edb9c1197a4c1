"""`meshnet artifact verify`: hashes, markers, and the GGUF facts of SmolLM2."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from meshnet.artifacts.spec import load_artifact
from meshnet.artifacts.verify import verify_folder
from meshnet.errors import ExpectationMismatch, HashMismatch, IncompleteSplitSet

from .conftest import copy_set


@pytest.fixture
def artifact(split_set, tmp_path):
    return split_set.artifact_yaml(tmp_path / "ma.yaml")


def test_verify_prints_llama_30_blocks_576_and_the_bytes_per_layer(split_set, artifact, meshnet,
                                                                   capsys):
    result = meshnet("artifact", "verify", str(split_set.folder), "--artifact", str(artifact),
                     "--stage", "0:15", "--stage", "15:30")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "architecture       llama" in lines
    assert "blocks             30" in lines
    assert "embedding length   576" in lines
    assert "boundary           DENSE_RESIDUAL [576]" in lines
    assert any(line.startswith("bytes per layer    2,216,448") for line in lines)
    assert any(line.startswith("stage [15, 30)") for line in lines)
    with capsys.disabled():
        print("\n" + result.stdout)


def test_verify_json_carries_every_layer_size_and_the_stage_footprints(split_set, artifact,
                                                                      meshnet):
    result = meshnet("artifact", "verify", str(split_set.folder), "--artifact", str(artifact),
                     "--stage", "0:30", "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    facts = report["gguf"]
    assert report["result"] == "Verified"
    assert report["bytesVerified"] == split_set.total
    assert (facts["architecture"], facts["blockCount"], facts["embeddingLength"]) == (
        "llama", 30, 576)
    assert facts["boundary"] == {"schema": "DENSE_RESIDUAL", "shape": [576], "tokenIds": False,
                                 "hashLayers": 0}
    assert len(facts["bytesPerLayer"]) == 30
    assert report["stageFootprints"]["0:30"] == facts["tensorBytes"]


def test_a_second_verify_trusts_matching_markers_unless_asked_for_a_full_one(
    split_set, artifact, tmp_path, null_meters
):
    folder = copy_set(split_set, tmp_path / "models")
    spec = load_artifact(artifact)

    first = verify_folder(folder, spec, null_meters)
    second = verify_folder(folder, spec, null_meters)
    full = verify_folder(folder, spec, null_meters, full=True)

    assert {f.how for f in first.files} == {"hashed"}
    assert {f.how for f in second.files} == {"marker"}
    assert {f.how for f in full.files} == {"hashed"}


def test_a_byte_flipped_after_verification_is_caught(split_set, artifact, tmp_path, null_meters,
                                                    meshnet):
    folder = copy_set(split_set, tmp_path / "models")
    spec = load_artifact(artifact)
    verify_folder(folder, spec, null_meters)  # leaves markers behind
    victim = folder / split_set.files[2].name
    with open(victim, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\x00\x01")

    with pytest.raises(HashMismatch) as caught:
        verify_folder(folder, spec, null_meters)
    result = meshnet("artifact", "verify", str(folder), "--artifact", str(artifact))

    assert caught.value.name == victim.name
    assert caught.value.expected == split_set.manifest.entries[2].sha256
    assert result.returncode == 1
    assert victim.name in result.stderr and "sha256 mismatch" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_file_is_an_incomplete_split_set(split_set, artifact, tmp_path, null_meters):
    folder = copy_set(split_set, tmp_path / "models")
    (folder / split_set.files[1].name).unlink()

    with pytest.raises(IncompleteSplitSet, match=split_set.files[1].name):
        verify_folder(folder, load_artifact(artifact), null_meters)


def test_headers_that_contradict_the_expectations_are_refused(split_set, artifact, null_meters):
    document = yaml.safe_load(artifact.read_text())
    document["spec"]["expectations"]["blockCount"] = 43
    artifact.write_text(yaml.safe_dump(document))

    with pytest.raises(ExpectationMismatch, match=r"block count is 30.*says 43"):
        verify_folder(split_set.folder, load_artifact(artifact), null_meters, full=True)


def test_an_invalid_artifact_file_is_a_clean_error(split_set, tmp_path, meshnet):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: meshnet.dev/v1alpha1\nkind: ModelArtifact\nmetadata: {name: x}\n"
                   "spec:\n  files:\n  - {name: a/b.gguf, size: 1, sha256: xyz}\n")

    result = meshnet("artifact", "verify", str(split_set.folder), "--artifact", str(bad))

    assert result.returncode == 1
    assert "spec.files.0" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_file_changed_in_place_with_its_mtime_restored_passes_until_a_full_verify(
        split_set, artifact, tmp_path, meshnet):
    folder = copy_set(split_set, tmp_path / "models")
    assert meshnet("artifact", "verify", str(folder), "--artifact", str(artifact)).returncode == 0
    victim = folder / split_set.files[0].name
    before = victim.stat()
    with open(victim, "r+b") as handle:
        handle.seek(-4096, os.SEEK_END)  # tensor data, not the header
        handle.write(b"\xff")
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))

    trusted = meshnet("artifact", "verify", str(folder), "--artifact", str(artifact))
    full = meshnet("artifact", "verify", str(folder), "--artifact", str(artifact), "--full")

    assert trusted.returncode == 0, trusted.stderr  # what the help text warns about
    assert f"ok  {victim.name}" in trusted.stdout and "(verified marker)" in trusted.stdout
    assert full.returncode == 1
    assert victim.name in full.stderr and "sha256 mismatch" in full.stderr
    help_text = meshnet("artifact", "verify", "--help").stdout
    assert "size and mtime" in help_text and "--full" in help_text
