"""The Tracker daemon's view of a route of several replicas: one whole pipeline (replica
0's pods), never a mix of stages from different replicas."""

from __future__ import annotations

from typing import Any

from meshnet.tracker.kubernetes import current_pods


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
