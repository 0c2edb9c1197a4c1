"""How `meshnet up` wires the planner's chain or ring on loopback: which worker starts
first, where each stage relays, and that a ring's head is ready once it is subscribed."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.local.links import NotListening, loopback_links, start_order
from meshnet.local.process import WorkerProcess, free_port
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


def planned(topology: str, stages: list[tuple[str, int, int]] | None = None) -> list[Create]:
    """The stage pods the planner creates for the example route file with `topology`."""
    artifact, route = yaml.safe_load_all(EXAMPLE.read_text())
    route["spec"]["recipe"]["topology"] = topology
    if stages:
        route["spec"]["stages"] = [{"name": n, "layers": {"begin": b, "end": e}}
                                   for n, b, e in stages]
    route["metadata"] |= {"namespace": "local", "uid": "local-smollm2", "generation": 1}
    digest = ModelArtifactSpec.model_validate(artifact["spec"]).manifest_digest()
    artifact["status"] = {"manifestDigest": digest,
                          "conditions": [{"type": "Ready", "status": "True"}]}
    observed = Observed(observe_route(route), (), None, observe_referenced_artifact(artifact))
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
    with pytest.raises(ValueError, match=r"no loopback endpoint given for stage middle, tail"):
        launch_spec(head, smollm2, 1)  # a chain that silently became a hub


def test_a_ring_head_is_ready_only_once_it_is_subscribed_at_the_last_stage(
        shard_worker: Path, smollm2: Path) -> None:
    head_create, tail_create = planned("ring", [("head", 0, 15), ("tail", 15, 30)])
    assert head_create.worker is not None and tail_create.worker is not None
    tail_at = f"127.0.0.1:{free_port()}"  # nothing listens there yet
    links = loopback_links(head_create.worker, {"tail": tail_at})
    head = LocalStage(head_create.obj, head_create.worker, WorkerProcess(
        shard_worker, launch_spec(head_create.worker, smollm2, 1, links)))
    tail = WorkerProcess(shard_worker, replace(launch_spec(tail_create.worker, smollm2, 1),
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
