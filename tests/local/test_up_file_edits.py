"""`meshnet up` follows its route file however it is saved, and an edit it cannot use
(a missing file, a wrong shape, a layout that cannot be served) leaves the route serving
as it was, said once, until the file is fixed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from meshnet.local.registry import process_alive as pid_alive

from .conftest import EXAMPLE, UpSession

PROMPT = "The three primary colors are"
MISSING = "cannot read"


def assert_serving(up: UpSession, pids: list[int], epoch: int,
                   reference: Callable[..., list[int]]) -> None:
    """The same workers run and answer with the reference tokens at `epoch`."""
    assert all(pid_alive(p) for p in pids)
    assert [s["pid"] for s in up.wait_for(lambda r: True)["stages"]] == pids
    answer = up.generate(PROMPT, max_tokens=8)
    assert answer["route"]["epoch"] == epoch
    assert answer["tokens"] == reference(answer["prompt_tokens"], len(answer["tokens"]))


def test_up_runs_on_while_its_file_is_gone_and_reads_it_again_once_saved(
    up: UpSession, reference: Callable[..., list[int]]
) -> None:
    first = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    pids = [s["pid"] for s in first["stages"]]
    two = up.stages_text([("front", 0, 15), ("back", 15, 30)])

    up.route_file.unlink()  # delete, and for a while write nothing
    said = up.said(MISSING)
    time.sleep(10 * 0.3)  # ten more looks at the file (--interval 0.3) while it stays gone
    assert_serving(up, pids, 1, reference)
    assert "epoch 1 runs on" in said and "No such file or directory" in said
    assert up.log.read_text().count(MISSING) == 1  # said once, not at every look

    up.route_file.write_text(two)  # ... then write it again
    second = up.wait_for(lambda r: r["epoch"] == 2)
    assert [s["layers"] for s in second["stages"]] == ["0:15", "15:30"]

    saved = up.route_file.with_name(".route.yaml.swp")  # write beside, rename over it
    saved.write_text(up.stages_text([("head", 0, 12), ("middle", 12, 20), ("tail", 20, 30)]))
    os.replace(saved, up.route_file)
    third = up.wait_for(lambda r: r["epoch"] == 3)
    assert [s["layers"] for s in third["stages"]] == ["0:12", "12:20", "20:30"]
    assert up.process.poll() is None


def test_an_invalid_edit_is_reported_and_the_route_serves_on_until_the_file_is_fixed(
    up: UpSession, reference: Callable[..., list[int]]
) -> None:
    first = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    pids = [s["pid"] for s in first["stages"]]
    short = up.stages_text([("head", 0, 10), ("middle", 10, 20), ("tail", 20, 29)])
    fixed = up.stages_text([("front", 0, 15), ("back", 15, 30)])

    docs = list(yaml.safe_load_all(up.route_file.read_text()))
    docs[1]["spec"] = [1, 2]  # readable YAML of the wrong shape
    up.route_file.write_text(yaml.safe_dump_all(docs))
    said = up.said("the spec of ShardRoute smollm2 is a list, not a mapping")
    assert "ignoring the changed file (epoch 1 runs on)" in said and "invalid spec" in said

    up.route_file.write_text(short)  # layer 29 would be served by no stage
    said = up.said("layer 29 would never run")
    assert "invalid spec: spec.stages[2].layers: stage 'tail' ends at layer 29" in said
    assert_serving(up, pids, 1, reference)  # the last good epoch, its workers untouched

    up.route_file.write_text(fixed)  # rolls out as usual
    second = up.wait_for(lambda r: r["epoch"] == 2)
    assert [s["layers"] for s in second["stages"]] == ["0:15", "15:30"]
    assert not any(pid_alive(p) for p in pids)


def head_begins_at_layer_2(spec: dict[str, Any]) -> None:
    spec["stages"][0]["layers"]["begin"] = 2


def negative_replicas(spec: dict[str, Any]) -> None:
    spec["replicas"] = -1


@pytest.mark.parametrize(("edit", "message"), [
    (head_begins_at_layer_2,
     "invalid spec: spec.stages[0].layers: stage 'head' begins at layer 2"),
    (negative_replicas, "spec.replicas"),
], ids=["layers", "replicas"])
def test_up_refuses_a_route_file_that_cannot_be_served_from_the_start(
        tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str) -> None:
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    docs[0]["spec"]["storage"]["hostPath"]["path"] = str(tmp_path / "models")
    edit(docs[1]["spec"])
    route_file = tmp_path / "route.yaml"
    route_file.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [sys.executable, "-m", "meshnet.cli", "up", "-f", str(route_file), "--serve", ""],
        env={**os.environ, "MESHNET_CACHE": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_wrong_sha256_digit_keeps_the_served_model_and_undoing_it_changes_nothing(
    up: UpSession, reference: Callable[..., list[int]]
) -> None:
    """One wrong hex digit used to move the served GGUF to quarantine: the next worker
    crash found no file and every stage crash-looped."""
    first = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    good = up.route_file.read_text()
    docs = list(yaml.safe_load_all(good))
    entry = docs[0]["spec"]["files"][0]
    entry["sha256"] = entry["sha256"][:-1] + ("0" if entry["sha256"][-1] != "0" else "1")
    storage = Path(docs[0]["spec"]["storage"]["hostPath"]["path"]) / entry["name"]
    inode = storage.stat().st_ino
    # Workers load their manifest's own links to the verified files (kept for its epoch).
    model = Path(first["model"])
    assert model.parent.name == first["manifestDigest"] and model.stat().st_ino == inode

    up.route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    said = up.said("HashMismatch")
    assert "ignoring the changed file (epoch 1 runs on)" in said and entry["sha256"] in said
    assert storage.stat().st_ino == inode  # the file in place stays where it was

    victim = first["stages"][1]
    os.kill(victim["pid"], signal.SIGKILL)  # its restart loads the model file again
    restarted = up.wait_for(
        lambda r: len(r["stages"]) == 3 and r["stages"][1]["pid"] != victim["pid"])
    pids = [s["pid"] for s in restarted["stages"]]
    assert_serving(up, pids, 1, reference)

    up.route_file.write_text(good)  # the undo: the spec that runs, nothing to do
    time.sleep(10 * 0.3)  # ten looks at the file (--interval 0.3) and reconciles after it
    assert_serving(up, pids, 1, reference)  # same workers, same epoch: nothing restarted
    undo = up.log.read_text().rsplit("HashMismatch", 1)[1]
    assert "provisioning" not in undo and "EpochAdvanced" not in undo
    assert storage.stat().st_ino == inode


def test_renaming_the_route_is_refused_and_it_serves_on_under_its_name(
    up: UpSession, reference: Callable[..., list[int]]
) -> None:
    first = up.wait_for(lambda r: r["epoch"] == 1 and len(r["stages"]) == 3)
    pids = [s["pid"] for s in first["stages"]]
    up.wait_for_gateway()

    docs = list(yaml.safe_load_all(up.route_file.read_text()))
    docs[1]["metadata"]["name"] = "renamed"  # with a layout change, which waits too
    docs[1]["spec"]["stages"] = [{"name": "front", "layers": {"begin": 0, "end": 15}},
                                 {"name": "back", "layers": {"begin": 15, "end": 30}}]
    up.route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    said = up.said("cannot be renamed")
    assert "ignoring the changed file (epoch 1 runs on)" in said
    assert "ShardRoute local/smollm2 cannot be renamed to local/renamed" in said
    time.sleep(10 * 0.3)  # ten more reconciles (--interval 0.3)

    assert_serving(up, pids, 1, reference)
    answer = httpx.post(up.gateway + "/completions", timeout=120, json={
        "model": "smollm2", "prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert answer.status_code == 200, answer.text  # the gateway serves the route it names
    assert up.stop() == 0
    assert not list((up.cache / "routes").glob("*.json"))  # withdrawn: no stale entry
