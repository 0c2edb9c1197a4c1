"""The Tracker daemon's view of a route of several replicas: whole pipelines (replica 0's
pods for the report's stages, each ready replica's serving pipeline for its capacity),
never a mix of stages from different replicas or epochs."""

from __future__ import annotations

from typing import Any

from meshnet.api.shardroute import ShardRouteSpec
from meshnet.tracker.kubernetes import current_pods, replica_views


def pod(stage: str, replica: int | None, epoch: int = 1) -> dict[str, Any]:
    tags = {"meshnet.dev/route": "r1", "meshnet.dev/stage": stage,
            "meshnet.dev/epoch": str(epoch)}
    if replica is not None:
        tags["meshnet.dev/replica"] = str(replica)
    suffix = f"-r{replica}" if replica else ""
    return {"metadata": {"name": f"r1-{stage}-e{epoch}{suffix}", "labels": tags}}


def test_the_stage_pods_reported_are_replica_zeros_whatever_the_order() -> None:
    pods = [pod("s0", 0), pod("s0", 1), pod("s1", 1), pod("s1", 0), pod("s2", 2, epoch=0)]
    found = current_pods(pods, "r1", 1)
    assert {stage: p["metadata"]["name"] for stage, p in found.items()} == {
        "s0": "r1-s0-e1", "s1": "r1-s1-e1"}


def test_pods_from_before_replicas_count_as_replica_zero() -> None:
    assert list(current_pods([pod("s0", None)], "r1", 1)) == ["s0"]


def ready(pod_: dict[str, Any]) -> dict[str, Any]:
    return pod_ | {"status": {"podIP": "10.0.0.1", "conditions": [
        {"type": "Ready", "status": "True"}]}}


def test_each_ready_replica_is_sampled_on_the_pipeline_that_serves_it() -> None:
    """Replica 1 is still served by epoch 1 while replica 0 runs epoch 2: each is read at
    its own epoch; a replica that is not ready is not sampled."""
    spec = ShardRouteSpec.model_validate({
        "artifactRef": {"name": "a"}, "recipe": {"contextLength": 512},
        "stages": [{"name": "s0", "layers": {"begin": 0, "end": 2}},
                   {"name": "s1", "layers": {"begin": 2, "end": 4}}]})
    pods = [ready(pod(s, r, e)) for s in ("s0", "s1") for r, e in ((0, 2), (0, 1), (1, 1),
                                                                   (1, 2), (2, 2))]
    body = {"metadata": {"name": "r1"}, "status": {"epoch": 2, "replicaStatuses": [
        {"replica": 0, "epoch": 2, "ready": True}, {"replica": 1, "epoch": 1, "ready": True},
        {"replica": 2, "epoch": 2, "ready": False}]}}

    views = replica_views(spec, body, pods, 9000)

    assert [(v.replica, v.epoch, [s.name for s in v.stages]) for v in views] == [
        (0, 2, ["s0", "s1"]), (1, 1, ["s0", "s1"])]
    assert all(s.ready and s.endpoint == "10.0.0.1:9000" for v in views for s in v.stages)


def test_a_status_from_before_replicas_lists_none() -> None:
    assert replica_views(ShardRouteSpec.model_validate({
        "artifactRef": {"name": "a"}, "recipe": {"contextLength": 512},
        "stages": [{"name": "s0", "layers": {"begin": 0, "end": 2}}]}),
        {"metadata": {"name": "r1"}, "status": {"epoch": 1}}, [ready(pod("s0", 0))], 9000) == []
