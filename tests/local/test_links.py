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
from meshnet.local.links import NotListening, loopback_links, pod_address, start_order
from meshnet.local.stages import LocalStage, worker_spec
from meshnet.reconcile import Create, Observed, WorkerConfig, observe_artifact, observe_route, plan
from meshnet.route.launch import WorkerProcess, free_port
from meshnet.timestamps import utc_now

from .conftest import EXAMPLE

CONFIG = WorkerConfig(images={"cpu": "local"}, pin_digest="p" * 64)
PORT = CONFIG.grpc_port


def planned_pods(topology: str, stages: list[tuple[str, int, int]] | None = None
                 ) -> list[dict[str, Any]]:
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
    observed = Observed(observe_route(route), (), None, observe_artifact(artifact))
    return [a.obj for a in plan(observed, CONFIG, utc_now()).actions
            if isinstance(a, Create) and a.obj["kind"] == "Pod"]


def stage_names(pods: list[dict[str, Any]]) -> list[str]:
    return [pod["spec"]["hostname"] for pod in pods]


@pytest.mark.parametrize(("topology", "order"), [
    ("hub", ["head", "middle", "tail"]),
    ("chain", ["tail", "middle", "head"]),
    ("ring", ["tail", "middle", "head"]),
])
def test_a_chain_starts_from_its_last_stage_so_every_stage_names_a_listening_one(
        topology: str, order: list[str]) -> None:
    assert stage_names(start_order(planned_pods(topology), PORT)) == order


def test_a_stage_relays_to_the_loopback_endpoints_of_the_stages_it_names() -> None:
    head, middle, tail = planned_pods("ring")
    listening = {pod_address(middle, PORT): "127.0.0.1:7002",
                 pod_address(tail, PORT): "127.0.0.1:7003"}
    assert loopback_links(head, listening) == {"--next-stage": "127.0.0.1:7002",
                                               "--ring-last": "127.0.0.1:7003"}
    assert loopback_links(tail, listening) == {}
    with pytest.raises(NotListening, match=r"waiting for tail\.smollm2-workers\.local\.svc"):
        loopback_links(middle, {pod_address(middle, PORT): "127.0.0.1:7002"})


def test_a_ring_head_is_ready_only_once_it_is_subscribed_at_the_last_stage(
        shard_worker: Path, smollm2: Path) -> None:
    head_pod, tail_pod = planned_pods("ring", [("head", 0, 15), ("tail", 15, 30)])
    tail_at = f"127.0.0.1:{free_port()}"  # nothing listens there yet
    links = loopback_links(head_pod, {pod_address(tail_pod, PORT): tail_at})
    head = LocalStage(head_pod, WorkerProcess(shard_worker, worker_spec(
        head_pod, smollm2, 1, links)))
    tail = WorkerProcess(shard_worker, replace(worker_spec(tail_pod, smollm2, 1), listen=tail_at))
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
