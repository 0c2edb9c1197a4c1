"""`meshnet artifact manifest` and the split-set rules it enforces."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from typing import Any

import pytest
import yaml

from meshnet.artifacts.gguf_header import GGUFHeader
from meshnet.artifacts.splitset import check_split_names, order_split_set
from meshnet.bundled import smollm2_gguf
from meshnet.digests import manifest_digest
from meshnet.errors import IncompleteSplitSet

from .conftest import make_split_set


def header(name: str, no: int, count: int = 3, total: int = 3, tensors: int = 1,
           arch: str | None = None) -> GGUFHeader:
    metadata = {"general.architecture": arch} if arch else {}
    return GGUFHeader(name, no, count, total, metadata,
                      {f"{name}.t{i}": 10 for i in range(tensors)})


def refused(text: str) -> Any:
    return pytest.raises(IncompleteSplitSet, match=re.escape(text))


def good_set() -> list[GGUFHeader]:
    return [header("m-00001-of-00003.gguf", 0, arch="llama"),
            header("m-00002-of-00003.gguf", 1), header("m-00003-of-00003.gguf", 2)]


def test_a_complete_split_set_is_ordered_by_split_number():
    ordered = order_split_set(list(reversed(good_set())))

    assert [h.name for h in ordered] == [h.name for h in good_set()]


def test_a_missing_split_is_named():
    with refused("1 of 3 missing (m-00002-of-00003.gguf)"):
        order_split_set([good_set()[0], good_set()[2]])


def test_a_split_claimed_twice_is_refused():
    twice = [*good_set()[:2], header("x-00003-of-00003.gguf", 1)]

    with refused("both claim split 2 of 3"):
        order_split_set(twice)


def test_splits_of_different_sets_are_refused():
    mixed = [*good_set()[:2], header("m-00003-of-00003.gguf", 2, count=4, total=4)]

    with refused("different split sets"):
        order_split_set(mixed)


def test_a_split_named_unlike_its_header_is_refused():
    renamed = [*good_set()[:2], header("other-00003-of-00003.gguf", 2)]

    with refused("llama.cpp will look for m-00003-of-00003.gguf"):
        order_split_set(renamed)


def test_tensors_must_add_up_to_the_declared_count():
    short = [*good_set()[:2], header("m-00003-of-00003.gguf", 2, tensors=0)]

    with refused("2 tensors but declare split.tensors.count 3"):
        order_split_set(short)


def test_two_architectures_in_one_set_are_refused():
    two = [*good_set()[:2], header("m-00003-of-00003.gguf", 2, arch="qwen2")]

    with refused("several architectures"):
        order_split_set(two)


def test_a_whole_model_beside_splits_is_refused():
    whole = GGUFHeader("whole.gguf", metadata={"general.architecture": "llama"})

    with refused("whole.gguf is a whole model"):
        order_split_set([*good_set(), whole])


def test_names_alone_reveal_a_partial_or_mixed_list():
    check_split_names(["m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "README.md"])
    with refused("m-00002-of-00003.gguf"):
        check_split_names(["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"])
    with refused("more than one split set"):
        check_split_names(["m-00001-of-00002.gguf", "m-00002-of-00003.gguf"])


def test_manifest_of_the_smollm2_split_set_is_a_model_artifact_with_its_digest(
    split_set, meshnet, tmp_path
):
    out = tmp_path / "ma.yaml"

    result = meshnet("artifact", "manifest", str(split_set.folder), "--out", str(out),
                     "--base-url", "https://models.example/smollm2/")

    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(out.read_text())
    files = document["spec"]["files"]
    assert [f["name"] for f in files] == [p.name for p in split_set.files]
    for entry, path in zip(files, split_set.files, strict=True):
        assert entry["size"] == path.stat().st_size
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    digest = manifest_digest((f["name"], f["size"], f["sha256"]) for f in files)
    assert document["metadata"]["annotations"]["meshnet.dev/manifest-digest"] == digest
    assert digest in out.read_text().splitlines()[0]
    assert document["spec"]["expectations"] == {"architecture": "llama", "blockCount": 30}
    assert document["spec"]["source"] == {"http": {"baseURL": "https://models.example/smollm2/"}}
    assert document["metadata"]["name"] == "smollm2"


def test_manifest_of_a_partial_set_is_refused_naming_what_is_missing(split_set, meshnet, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    for path in (split_set.files[0], split_set.files[2]):
        os.symlink(path, partial / path.name)
    out = tmp_path / "ma.yaml"

    result = meshnet("artifact", "manifest", str(partial), "--out", str(out))

    assert result.returncode == 1
    assert "smollm2-00002-of-00003.gguf" in result.stderr and "missing" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("other_run,problem", [
    ("32M", "different split sets"),  # four splits: split.count gives it away
    ("35M", "some split is truncated or from another set"),  # three, cut elsewhere
])
def test_manifest_of_splits_from_two_split_runs_is_refused(split_set, meshnet, tmp_path,
                                                           other_run, problem):
    finer = make_split_set(tmp_path / "finer", max_size=other_run)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    os.symlink(split_set.files[0], mixed / split_set.files[0].name)
    os.symlink(split_set.files[2], mixed / split_set.files[2].name)
    # A split of the finer run, renamed to fill the gap: only its header gives it away.
    shutil.copy(finer[1], mixed / split_set.files[1].name)

    result = meshnet("artifact", "manifest", str(mixed))

    assert result.returncode == 1
    assert problem in result.stderr
    assert "Traceback" not in result.stderr


def test_manifest_of_one_unsplit_gguf_is_a_one_file_artifact(meshnet):
    result = meshnet("artifact", "manifest", str(smollm2_gguf()))

    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert [f["name"] for f in document["spec"]["files"]] == [smollm2_gguf().name]
    assert document["metadata"]["name"] == "smollm2-135m-instruct-q4-1"


def test_a_file_that_is_not_gguf_is_refused_by_name(meshnet, tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"<html>404 not found</html>" * 10)

    result = meshnet("artifact", "manifest", str(fake))

    assert result.returncode == 1
    assert "model.gguf is not a readable GGUF file" in result.stderr
    assert "Traceback" not in result.stderr
