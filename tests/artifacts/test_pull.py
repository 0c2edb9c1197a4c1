"""`meshnet artifact pull` against a real HTTP server with Range, on a real split set."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from meshnet.artifacts.markers import Layout
from meshnet.artifacts.pull import compact_json, pull
from meshnet.artifacts.retain import keep_manifest, prune_manifests
from meshnet.artifacts.retry import RetryPolicy
from meshnet.artifacts.sources import HttpSource
from meshnet.artifacts.spec import load_artifact
from meshnet.digests import manifest_digest

from .conftest import SplitSet, copy_set, meshnet_command


def on_disk(dest: Path) -> int:
    """Bytes of the artifact already written into `dest` (partials and finished files)."""
    return sum(p.stat().st_size for p in dest.glob("*.gguf*") if p.is_file())


def same_files(split_set: SplitSet, dest: Path) -> bool:
    return all((dest / f.name).read_bytes() == f.read_bytes() for f in split_set.files)


def test_pull_downloads_verifies_and_reports_gguf_facts(split_set, serve, meshnet, tmp_path):
    server, url = serve(split_set.folder)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest = tmp_path / "models"

    termination_log = tmp_path / "termination-log"

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest), "--json",
                     "--summary-file", str(termination_log))

    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["result"] == "Verified"
    assert json.loads(termination_log.read_text()) == summary  # small enough to keep whole
    assert summary["manifestDigest"] == manifest_digest(
        (e.name, e.size, e.sha256) for e in split_set.manifest.entries)
    assert summary["filesVerified"] == summary["filesTotal"] == 3
    assert summary["bytesVerified"] == summary["bytesReceived"] == split_set.total
    assert summary["gguf"]["architecture"] == "llama"
    assert summary["gguf"]["blockCount"] == 30
    assert summary["gguf"]["embeddingLength"] == 576
    assert same_files(split_set, dest)
    assert not list(dest.glob("*.partial"))
    assert server.bytes_sent == split_set.total


def test_a_second_pull_skips_files_whose_verified_marker_matches(split_set, serve, meshnet,
                                                                  tmp_path):
    server, url = serve(split_set.folder)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest = tmp_path / "models"
    first = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest))
    assert first.returncode == 0, first.stderr
    server.reset_counts()

    again = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest), "--json")

    assert again.returncode == 0, again.stderr
    assert {f["state"] for f in json.loads(again.stdout)["files"]} == {"skipped"}
    assert server.bytes_sent == 0


def test_a_pull_killed_half_way_resumes_with_range_and_resends_little(split_set, serve,
                                                                      tmp_path, capsys):
    # Throttled so that "half way" lasts long enough to be caught from outside.
    server, url = serve(split_set.folder, rate=25e6)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest = tmp_path / "models"
    command = meshnet_command("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest))
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while on_disk(dest) < split_set.total // 2:
        assert first.poll() is None, "the pull ended before half way"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = on_disk(dest)
    assert list(dest.glob("*.partial")), "nothing was left half done"

    server.reset_counts()
    server.rate = None
    second = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300)

    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["result"] == "Verified"
    assert same_files(split_set, dest)
    resumed = [r for r in server.range_requests() if r.range and r.range != "bytes=0-"]
    assert resumed, f"no Range request after the kill: {server.requests}"
    resent = server.bytes_sent / split_set.total
    with capsys.disabled():
        print(f"\nresume: killed at {killed_at / split_set.total:.1%} on disk; re-sent "
              f"{server.bytes_sent:,} of {split_set.total:,} bytes = {resent:.1%} "
              f"({resumed[0].path} {resumed[0].range})")
    assert resent < 0.55


def test_one_flipped_byte_is_a_hash_mismatch_naming_the_file(split_set, serve, meshnet, tmp_path):
    served = copy_set(split_set, tmp_path / "served")
    victim = served / split_set.files[1].name
    with open(victim, "r+b") as handle:
        handle.seek(12345)
        byte = handle.read(1)
        handle.seek(12345)
        handle.write(bytes([byte[0] ^ 0x01]))
    actual = hashlib.sha256(victim.read_bytes()).hexdigest()
    expected = split_set.manifest.entries[1].sha256
    _, url = serve(served)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest = tmp_path / "models"

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest), "--json")

    assert result.returncode == 1  # worth retrying: the next transfer may be clean
    summary = json.loads(result.stdout)
    assert summary["result"] == "HashMismatch"
    assert victim.name in summary["message"]
    assert expected in summary["message"] and actual in summary["message"]
    assert "HashMismatch" in result.stderr and victim.name in result.stderr
    assert not (dest / victim.name).exists()
    assert not (dest / f"{victim.name}.partial").exists()
    assert Layout(dest).quarantine(victim.name).read_bytes() == victim.read_bytes()
    states = {f["name"]: f["state"] for f in summary["files"]}
    assert states[victim.name] == "failed"
    assert [s for n, s in states.items() if n != victim.name] == ["downloaded", "downloaded"]


def test_a_missing_split_file_is_an_incomplete_split_set(split_set, serve, meshnet, tmp_path):
    server, url = serve(split_set.folder)
    missing = split_set.files[1].name
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url, drop=(missing,))
    dest = tmp_path / "models"

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest), "--json")

    assert result.returncode == 3  # a spec problem: retrying cannot help
    summary = json.loads(result.stdout)
    assert summary["result"] == "IncompleteSplitSet"
    assert missing in summary["message"]
    assert server.bytes_sent == 0
    assert "Traceback" not in result.stderr


def test_a_server_that_drops_connections_at_random_still_yields_the_exact_files(
    split_set, serve, tmp_path, null_meters
):
    server, url = serve(split_set.folder, drop_probability=0.6, seed=7)
    artifact = load_artifact(split_set.artifact_yaml(tmp_path / "ma.yaml", url))
    dest = tmp_path / "models"
    source = HttpSource(url)
    try:
        summary = pull(artifact, dest, source, null_meters,
                       policy=RetryPolicy(max_attempts=20, base_seconds=0.01, cap_seconds=0.05),
                       rng=random.Random(1))
    finally:
        source.close()

    assert summary.ok, summary.message
    assert same_files(split_set, dest)
    dropped = [r for r in server.requests if r.dropped]
    assert len(dropped) >= 3, "the server never dropped a connection: the test proves nothing"
    assert len(server.range_requests()) >= len(dropped)
    # Every retry continued where the last one stopped: nothing arrived twice.
    assert summary.to_json()["bytesReceived"] == split_set.total


@pytest.mark.parametrize("via_symlink", [False, True])
def test_a_destination_under_home_is_refused_before_any_byte_is_written(
    split_set, serve, meshnet, tmp_path, via_symlink
):
    server, url = serve(split_set.folder)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    target = Path("/home") / f"meshnet-test-{os.getpid()}-{via_symlink}" / "models"
    if via_symlink:
        (tmp_path / "link").symlink_to(target.parent)
        dest = tmp_path / "link" / "models"
    else:
        dest = target

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest), "--json")

    assert result.returncode == 3
    summary = json.loads(result.stdout)
    assert summary["result"] == "StorageRefused"
    assert "/home" in summary["message"]
    assert not target.parent.exists()
    assert server.requests == []


def test_a_pull_that_cannot_fit_is_refused_before_downloading(split_set, serve, meshnet, tmp_path):
    server, url = serve(split_set.folder)
    huge = {split_set.files[2].name: 1 << 60}
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url, size_of=huge)
    dest = tmp_path / "models"

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest), "--json")

    assert result.returncode == 3
    summary = json.loads(result.stdout)
    assert summary["result"] == "StorageRefused"
    assert "not enough space" in summary["message"]
    assert server.requests == []
    assert not list(dest.glob("*.gguf*"))


def test_a_resumed_pull_rechecks_its_prefix_and_refetches_from_a_damaged_chunk(
    split_set, serve, tmp_path, null_meters
):
    server, url = serve(split_set.folder, drop_probability=1.0, seed=3)
    artifact = load_artifact(split_set.artifact_yaml(tmp_path / "ma.yaml", url))
    dest = tmp_path / "models"
    source = HttpSource(url)
    quick_give_up = RetryPolicy(max_attempts=1, base_seconds=0.0, cap_seconds=0.0)
    try:
        broken = pull(artifact, dest, source, null_meters, policy=quick_give_up)
        assert broken.result == "DownloadFailed"
        partial = dest / f"{split_set.files[0].name}.partial"
        kept = partial.stat().st_size
        assert kept > 2 << 20, "need a few checkpointed chunks to damage one"
        with open(partial, "r+b") as handle:  # damage the second 1 MiB chunk
            handle.seek((1 << 20) + 10)
            handle.write(b"\xff\xfe")
        server.drop_probability = 0.0
        server.reset_counts()
        healed = pull(artifact, dest, source, null_meters)
    finally:
        source.close()

    assert healed.ok, healed.message
    assert same_files(split_set, dest)
    first = next(r for r in server.requests if r.path.endswith(split_set.files[0].name))
    assert first.range == f"bytes={1 << 20}-"


def test_a_file_the_server_does_not_have_is_a_download_failure_naming_it(split_set, serve,
                                                                          meshnet, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    for path in split_set.files[1:]:
        os.symlink(path, served / path.name)
    server, url = serve(served)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest",
                     str(tmp_path / "models"), "--json")

    assert result.returncode == 1  # the file may appear: worth retrying later
    summary = json.loads(result.stdout)
    assert summary["result"] == "DownloadFailed"
    assert split_set.files[0].name in summary["message"] and "HTTP 404" in summary["message"]
    assert server.bytes_sent == 0  # the source is the problem: the other files wait


def test_two_pulls_into_one_folder_take_turns_and_fetch_each_byte_once(split_set, serve,
                                                                       tmp_path):
    server, url = serve(split_set.folder, rate=60e6)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest = tmp_path / "models"
    command = meshnet_command("artifact", "pull", "--artifact", str(artifact), "--dest",
                              str(dest), "--json")

    pulls = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=300) for p in pulls]

    assert [p.returncode for p in pulls] == [0, 0], results
    states = sorted(tuple(f["state"] for f in json.loads(out)["files"]) for out, _ in results)
    assert states == [("downloaded",) * 3, ("skipped",) * 3]
    assert any("waiting" in err for _, err in results)
    assert server.bytes_sent == split_set.total
    assert same_files(split_set, dest)


def test_a_summary_too_big_for_a_termination_message_keeps_totals_and_facts():
    report = {"result": "HashMismatch", "message": "x" * 5000, "filesTotal": 300,
              "files": [{"name": f"m-{i:05d}-of-00300.gguf"} for i in range(300)],
              "gguf": {"architecture": "deepseek4", "bytesPerLayer": [123456789] * 43}}

    text = compact_json(report, 4096)

    compact = json.loads(text)
    assert len(text.encode()) <= 4096
    assert compact["files"] == [] and compact["filesTotal"] == 300
    assert compact["gguf"] == {"architecture": "deepseek4"}
    assert compact["result"] == "HashMismatch" and compact["message"].endswith("...")


def with_extra_file(artifact: Path, name: str) -> Path:
    """The artifact file with one more manifest entry called `name`."""
    document = yaml.safe_load(artifact.read_text())
    document["spec"]["files"].append({"name": name, "size": 5, "sha256": "0" * 64})
    artifact.write_text(yaml.safe_dump(document, sort_keys=False))
    return artifact


@pytest.mark.parametrize("name", ["../outside.bin", "ABSOLUTE", "sub/inner.bin", "..",
                                  ".meshnet"])
def test_a_manifest_name_that_is_not_a_plain_file_name_is_refused_before_any_write(
        split_set, serve, meshnet, tmp_path, name):
    server, url = serve(split_set.folder)
    outside = tmp_path / "outside.bin"
    name = str(tmp_path / "absolute.bin") if name == "ABSOLUTE" else name
    artifact = with_extra_file(split_set.artifact_yaml(tmp_path / "ma.yaml", url), name)
    dest = tmp_path / "models"

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest), "--json")

    assert result.returncode == 3  # a spec problem: retrying cannot help
    summary = json.loads(result.stdout)
    assert summary["result"] == "InvalidSpec"
    assert repr(name) in summary["message"] and "not a plain file name" in summary["message"]
    assert not dest.exists()
    assert not outside.exists() and not (tmp_path / "absolute.bin").exists()
    assert server.requests == []


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_symlink_planted_at_a_partial_is_replaced_never_written_through(
        split_set, serve, meshnet, tmp_path, target_exists):
    server, url = serve(split_set.folder)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest = tmp_path / "models"
    dest.mkdir()
    victim = tmp_path / "victim.txt"
    if target_exists:
        victim.write_text("precious")
    (dest / f"{split_set.files[0].name}.partial").symlink_to(victim)

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest))

    assert result.returncode == 0, result.stderr
    assert "symbolic link" in result.stderr
    assert same_files(split_set, dest)
    assert victim.read_text() == "precious" if target_exists else not victim.exists()
    assert not list(dest.glob("*.partial"))
    assert server.bytes_sent == split_set.total  # nothing was taken from the link's target


def test_a_partial_hard_linked_to_another_file_is_recreated_never_written_through(
        split_set, serve, meshnet, tmp_path):
    server, url = serve(split_set.folder)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest = tmp_path / "models"
    dest.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.link(victim, dest / f"{split_set.files[0].name}.partial")

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest))

    assert result.returncode == 0, result.stderr
    assert "hard links: replacing it with a new file" in result.stderr
    assert same_files(split_set, dest)
    assert victim.read_text() == "precious"
    assert victim.stat().st_nlink == 1
    assert server.bytes_sent == split_set.total  # nothing was taken from the other file


@pytest.mark.parametrize("marked", [False, True])
def test_a_final_file_that_is_a_symlink_out_of_the_destination_is_not_verified(
        split_set, serve, meshnet, tmp_path, marked):
    """`marked`: a pull verified the file before it became a link (to a copy of the same
    size and mtime: its marker would match through the link)."""
    server, url = serve(split_set.folder)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    pull_args = ("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest))
    dest.mkdir()
    copy_set(split_set, elsewhere)  # the right bytes, but outside --dest
    first = split_set.files[0].name
    if marked:
        assert meshnet(*pull_args).returncode == 0
        mtime = (dest / first).stat().st_mtime_ns
        os.utime(elsewhere / first, ns=(mtime, mtime))
        (dest / first).unlink()
        server.reset_counts()
    (dest / first).symlink_to(elsewhere / first)

    result = meshnet(*pull_args)

    assert result.returncode == 0, result.stderr
    assert f"{first} is a symbolic link: removing it and fetching the file" in result.stderr
    assert not (dest / first).is_symlink()
    assert same_files(split_set, dest)
    assert server.bytes_sent == split_set.files[0].stat().st_size if marked else split_set.total
    assert (elsewhere / first).read_bytes() == split_set.files[0].read_bytes()


def test_a_state_folder_that_is_a_symlink_is_refused(split_set, serve, meshnet, tmp_path):
    server, url = serve(split_set.folder)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / ".meshnet").symlink_to(elsewhere)

    result = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest), "--json")

    assert result.returncode == 3
    summary = json.loads(result.stdout)
    assert summary["result"] == "StorageRefused"
    assert ".meshnet is a symbolic link" in summary["message"]
    assert list(elsewhere.iterdir()) == []
    assert server.requests == []


def test_pull_full_rehashes_files_its_markers_vouch_for_and_repairs_them(split_set, serve,
                                                                         meshnet, tmp_path):
    server, url = serve(split_set.folder)
    artifact = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    dest = tmp_path / "models"
    first = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest))
    assert first.returncode == 0, first.stderr
    victim = dest / split_set.files[1].name
    before = victim.stat()
    with open(victim, "r+b") as handle:
        handle.seek(-4096, os.SEEK_END)  # tensor data, not the header
        handle.write(b"\xff")
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))

    trusting = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest),
                       "--json")
    server.reset_counts()
    full = meshnet("artifact", "pull", "--artifact", str(artifact), "--dest", str(dest),
                   "--full", "--json")

    assert {f["state"] for f in json.loads(trusting.stdout)["files"]} == {"skipped"}
    assert full.returncode == 0, full.stderr
    states = {f["name"]: f["state"] for f in json.loads(full.stdout)["files"]}
    assert states[victim.name] == "downloaded"
    assert {s for n, s in states.items() if n != victim.name} == {"verified"}
    assert same_files(split_set, dest)
    assert server.bytes_sent == victim.stat().st_size  # only the changed file came again
    assert "size and mtime" in meshnet("artifact", "pull", "--help").stdout


def _with_sha256(artifact_yaml: Path, name: str, sha256: str) -> Path:
    """The ModelArtifact at `artifact_yaml` with file `name`'s sha256 set to `sha256`."""
    document = yaml.safe_load(artifact_yaml.read_text())
    entry = next(f for f in document["spec"]["files"] if f["name"] == name)
    entry["sha256"] = sha256
    changed = artifact_yaml.with_name(f"{sha256[:8]}-{artifact_yaml.name}")
    changed.write_text(yaml.safe_dump(document, sort_keys=False))
    return changed


def _one_digit_off(sha256: str) -> str:
    return sha256[:-1] + ("0" if sha256[-1] != "0" else "1")


def test_a_wrong_digit_in_a_sha256_leaves_the_verified_file_in_place_and_its_marker(
        split_set, serve, tmp_path, null_meters):
    """The file in place may be what running workers restart from: a pull of a spec it
    cannot satisfy must not move it away (it used to go to quarantine, marker left)."""
    server, url = serve(split_set.folder)
    good = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    victim = split_set.files[1].name
    typo = _with_sha256(good, victim, _one_digit_off(split_set.manifest.entries[1].sha256))
    dest = tmp_path / "models"
    layout = Layout(dest)
    source = HttpSource(url)
    try:
        assert pull(load_artifact(good), dest, source, null_meters).ok
        inode, marker = (dest / victim).stat().st_ino, layout.marker(victim).read_text()

        failed = pull(load_artifact(typo), dest, source, null_meters)

        assert failed.result == "HashMismatch"
        assert victim in failed.message and _one_digit_off(
            split_set.manifest.entries[1].sha256) in failed.message
        assert (dest / victim).stat().st_ino == inode  # not moved, not replaced
        assert same_files(split_set, dest)
        assert layout.marker(victim).read_text() == marker
        # Only the downloaded bytes that did not verify are kept for inspection.
        assert layout.quarantine(victim).read_bytes() == split_set.files[1].read_bytes()
        assert not (dest / f"{victim}.partial").exists()

        server.reset_counts()
        undone = pull(load_artifact(good), dest, source, null_meters)
    finally:
        source.close()

    # The old spec again: every file trusted by its marker, nothing fetched or hashed.
    assert undone.ok, undone.message
    assert {f.state for f in undone.files} == {"skipped"}
    assert server.bytes_sent == 0


def test_changed_bytes_replace_a_file_only_once_verified_and_its_old_manifest_keeps_them(
        split_set, serve, tmp_path, null_meters):
    """A genuinely changed file of the same name: workers of the old manifest's epoch,
    restarted while the new epoch starts, load their own bytes from its manifest folder."""
    served = copy_set(split_set, tmp_path / "served")
    _, url = serve(served)
    old_yaml = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    changed = split_set.files[2].name
    dest = tmp_path / "models"
    layout = Layout(dest)
    old = load_artifact(old_yaml)
    source = HttpSource(url)
    try:
        assert pull(old, dest, source, null_meters).ok
        old_folder = keep_manifest(layout, old.spec.manifest_digest(),
                                   [f.name for f in old.spec.files])
        _change_tail(served / changed)  # new tensor bytes, same name and size
        new = load_artifact(_with_served_sha256(old_yaml, served, changed))

        replaced = pull(new, dest, source, null_meters)
    finally:
        source.close()

    assert replaced.ok, replaced.message
    assert (dest / changed).read_bytes() == (served / changed).read_bytes()
    assert not layout.quarantine(changed).exists()
    assert all((old_folder / f.name).read_bytes() == f.read_bytes() for f in split_set.files)
    new_folder = keep_manifest(layout, new.spec.manifest_digest(), [f.name for f in new.spec.files])
    assert (new_folder / changed).read_bytes() == (served / changed).read_bytes()
    prune_manifests(layout, [old.spec.manifest_digest()])
    assert not old_folder.exists() and new_folder.is_dir()


def _with_served_sha256(artifact_yaml: Path, served: Path, name: str) -> Path:
    """The artifact with `name`'s sha256 that of the file now served."""
    digest = hashlib.sha256((served / name).read_bytes()).hexdigest()
    return _with_sha256(artifact_yaml, name, digest)


def _change_tail(path: Path) -> None:
    """New bytes near the end of a split (in its tensor data), same name and size."""
    with open(path, "r+b") as handle:
        handle.seek(-4096, os.SEEK_END)
        handle.write(b"\x7f")


def test_a_pull_that_fails_replaces_none_of_the_files_in_place(split_set, serve, tmp_path,
                                                               null_meters):
    """Two splits changed, one of them with a wrong digest: the verified one waits beside
    its old file, so the copy on disk stays the old manifest's, whole."""
    served = copy_set(split_set, tmp_path / "served")
    _, url = serve(served)
    old_yaml = split_set.artifact_yaml(tmp_path / "ma.yaml", url)
    first, last = split_set.files[0].name, split_set.files[2].name
    dest = tmp_path / "models"
    source = HttpSource(url)
    try:
        assert pull(load_artifact(old_yaml), dest, source, null_meters).ok
        for name in (first, last):
            _change_tail(served / name)
        right = _with_served_sha256(old_yaml, served, first)
        wrong = _with_sha256(right, last, _one_digit_off(split_set.manifest.entries[2].sha256))

        failed = pull(load_artifact(wrong), dest, source, null_meters)

        assert failed.result == "HashMismatch" and last in failed.message
        assert {f.name: f.state for f in failed.files}[first] == "staged"
        assert same_files(split_set, dest)  # the old manifest's copy, untouched
        fixed = load_artifact(_with_served_sha256(right, served, last))
        done = pull(fixed, dest, source, null_meters)
    finally:
        source.close()

    assert done.ok, done.message
    states = {f.name: f.state for f in done.files}
    assert states[first] == "resumed"  # its verified partial, re-checked, not fetched again
    assert all((dest / n).read_bytes() == (served / n).read_bytes() for n in (first, last))
