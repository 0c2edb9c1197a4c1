"""How `meshnet up` wires the planner's chain or ring on loopback: which worker starts
first, where each stage relays, and that a ring's head is ready once it is subscribed."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.local.links import NotListening, loopback_links, start_order
from meshnet.local.process import WorkerProcess, free_port, new_route_key_file
from meshnet.local.stages import LocalStage, launch_spec
from meshnet.reconcile.plan import Create
from meshnet.reconcile.route import (
    Observed,
    WorkerConfig,
    WorkerSpec,
    observe_referenced_artifact,
    observe_route,
    plan,
)
from meshnet.timestamps import utc_now

from .conftest import EXAMPLE

CONFIG = WorkerConfig(images={"cpu": "local"}, pin_digest="p" * 64)


def planned(topology: str, stages: list[tuple[str, int, int]] | None = None,
            speculation: dict[str, Any] | None = None) -> list[Create]:
    """The stage pods the planner creates for the example route file with `topology`."""
    artifact, route = yaml.safe_load_all(EXAMPLE.read_text())
    route["spec"]["recipe"]["topology"] = topology
    if speculation is not None:
        route["spec"]["recipe"]["speculation"] = speculation
    if stages:
        route["spec"]["stages"] = [{"name": n, "layers": {"begin": b, "end": e}}
                                   for n, b, e in stages]
    route["metadata"] |= {"namespace": "local", "uid": "local-smollm2", "generation": 1}
    digest = ModelArtifactSpec.model_validate(artifact["spec"]).manifest_digest()
    artifact["status"] = {"manifestDigest": digest,
                          "conditions": [{"type": "Ready", "status": "True"}]}
    observed = Observed(observe_route(route), (), {}, observe_referenced_artifact(artifact))
    return [a for a in plan(observed, CONFIG, utc_now()).actions
            if isinstance(a, Create) and a.worker is not None]


def workers(topology: str) -> list[WorkerSpec]:
    return [create.worker for create in planned(topology) if create.worker is not None]


@pytest.mark.parametrize(("topology", "order"), [
    ("hub", ["head", "middle", "tail"]),
    ("chain", ["tail", "middle", "head"]),
    ("ring", ["tail", "middle", "head"]),
])
def test_a_chain_starts_from_its_last_stage_so_every_stage_names_a_listening_one(
        topology: str, order: list[str]) -> None:
    assert [worker.stage for worker in start_order(workers(topology))] == order


def test_a_stage_relays_to_the_loopback_endpoints_of_the_stages_it_names(smollm2: Path) -> None:
    head, middle, tail = workers("ring")
    listening = {"middle": "127.0.0.1:7002", "tail": "127.0.0.1:7003"}
    spec = launch_spec(head, smollm2, 1, loopback_links(head, listening))
    assert (spec.next_stage, spec.ring_last) == ("127.0.0.1:7002", "127.0.0.1:7003")
    assert launch_spec(tail, smollm2, 1, loopback_links(tail, listening)).next_stage == ""
    with pytest.raises(NotListening, match=r"waiting for stage tail to listen"):
        loopback_links(middle, {"middle": "127.0.0.1:7002"})
    with pytest.raises(ValueError, match=r"no address given for stage middle, tail"):
        launch_spec(head, smollm2, 1)  # a chain that silently became a hub


SPECULATION_FLAGS = ("--max-loop-drafts", "--max-loop-windows", "--discard-depth")


def speculation_flags(args: list[str]) -> list[str]:
    """The speculation flags in a command line, each with its value."""
    return [word for i, flag in enumerate(args) if flag in SPECULATION_FLAGS
            for word in (flag, args[i + 1])]


def test_meshnet_up_gives_its_workers_the_recipes_speculation_as_the_operator_does(
        smollm2: Path) -> None:
    created = planned("chain", speculation={"mode": "Lookup", "maxDrafts": 3, "maxWindows": 2})
    head, middle, tail = (c.worker for c in created if c.worker is not None)
    listening = {"middle": "127.0.0.1:7002", "tail": "127.0.0.1:7003"}
    specs = [launch_spec(w, smollm2, 1, loopback_links(w, listening))
             for w in (head, middle, tail)]
    head_args, middle_args, tail_args = (speculation_flags(s.args()) for s in specs)
    assert head_args == [
        "--max-loop-drafts", "3", "--max-loop-windows", "2", "--discard-depth", "7"]
    assert middle_args == tail_args == ["--discard-depth", "7"]
    for spec, create in zip(specs, created, strict=True):  # the same flags as the pod's
        assert speculation_flags(spec.args()) == speculation_flags(
            create.obj["spec"]["containers"][0]["args"])
    plain = planned("chain")[0].worker
    assert plain is not None
    plain_spec = launch_spec(plain, smollm2, 1, loopback_links(plain, listening))
    assert speculation_flags(plain_spec.args()) == [
        "--max-loop-drafts", "0", "--max-loop-windows", "1"]


def test_a_ring_head_is_ready_only_once_it_is_subscribed_at_the_last_stage(
        shard_worker: Path, smollm2: Path, tmp_path: Path) -> None:
    head_create, tail_create = planned("ring", [("head", 0, 15), ("tail", 15, 30)])
    assert head_create.worker is not None and tail_create.worker is not None
    tail_at = f"127.0.0.1:{free_port()}"  # nothing listens there yet
    links = loopback_links(head_create.worker, {"tail": tail_at})
    key = new_route_key_file(tmp_path)  # the ring serves only the route's own first stage
    head = LocalStage(head_create.obj, head_create.worker, WorkerProcess(
        shard_worker, launch_spec(head_create.worker, smollm2, 1, links, key)))
    tail = WorkerProcess(shard_worker, replace(launch_spec(tail_create.worker, smollm2, 1,
                                                           route_key_file=key),
                                               listen=tail_at))
    try:
        head.process.start()
        assert head.alive() and not head.observed().ready

        tail.start()

        deadline = time.monotonic() + 30
        while not head.observed().ready:
            assert time.monotonic() < deadline, "\n".join(head.process.lines[-10:])
            time.sleep(0.05)
        assert head.process.spec.next_stage == head.process.spec.ring_last == tail_at
    finally:
        head.process.stop()
        tail.stop()
