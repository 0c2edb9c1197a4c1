"""A replica scaled away goes as soon as its stages hold no session and no gateway can
send it one, not drainSeconds later: kopf over kmock's emulator, real workers answering
GetCapacity at their pod IPs (the kubelet stand-in), and the Deployment controller's part
played by hand for the gateway."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from meshnet.devtools.cluster import Emulator, emulated_cluster, eventually, running_operator
from meshnet.local.process import free_port
from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator.settings import OperatorSettings

from .standins import NS, Kubelet, artifact, running

ROUTES = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/shardroutes"
ARTIFACTS = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/modelartifacts"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
DRAIN_SECONDS = 600  # far beyond the test: the replica must go on its sessions' end


def route_body() -> dict[str, Any]:
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ShardRoute",
            "metadata": {"name": "r1", "namespace": NS},
            "spec": {"artifactRef": {"name": "smollm2"}, "replicas": 2,
                     "rollout": {"drainSeconds": DRAIN_SECONDS},
                     "recipe": {"lane": "cpu", "contextLength": 256, "sessionSlots": 1},
                     "stages": [{"name": "s0", "layers": {"begin": 0, "end": 30}}]}}


def live(cluster: Emulator, resource: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in cluster.live(resource, NS)}


def status(cluster: Emulator) -> dict[str, Any]:
    return live(cluster, "meshnet.dev/v1alpha1/shardroutes").get("r1", {}).get("status") or {}


async def roll_out_gateway(cluster: Emulator) -> None:
    """The Deployment controller's part: every gateway pod runs the latest template."""
    deployment = live(cluster, "apps/v1/deployments")["r1-gateway"]
    generation = deployment["metadata"].get("generation") or 1
    await cluster.patch(f"{DEPLOYMENTS}/r1-gateway/status", json={"status": {
        "observedGeneration": generation, "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": 1, "availableReplicas": 1}})


async def test_a_replica_scaled_away_with_no_session_goes_at_once_once_the_gateway_rolled(
        shard_worker: Path, smollm2: Path, tmp_path: Path) -> None:
    settings = OperatorSettings(worker_images={"cpu": "meshnet/worker-cpu:test"},
                                pin_digest="p" * 64, metrics_port=0, health_port=0,
                                worker_grpc_port=free_port(),
                                gateway_image="meshnet/operator:test")
    async with emulated_cluster() as cluster:
        kubelet = Kubelet(cluster, shard_worker, smollm2, tmp_path)
        async with running_operator(cluster, settings, OperatorMetrics()), running(kubelet):
            body = artifact(smollm2)
            response = await cluster.post(ARTIFACTS, json={k: v for k, v in body.items()
                                                           if k != "status"})
            assert response.status == 200, await response.text()
            await cluster.patch(f"{ARTIFACTS}/smollm2/status", json={"status": body["status"]})
            response = await cluster.post(ROUTES, json=route_body())
            assert response.status == 200, await response.text()
            await eventually(lambda: status(cluster).get("readyReplicas") == 2, 120,
                             "two ready replicas of real workers")
            await roll_out_gateway(cluster)

            await cluster.patch(f"{ROUTES}/r1", json={"spec": {"replicas": 1}})
            await eventually(lambda: status(cluster).get("draining") == ["e1/r1"], 30,
                             "replica 1 draining")
            # The gateway's new template is not rolled out: its old pod could still send
            # replica 1 a session, so replica 1 stays (two polls) although it holds none.
            for _ in range(8):
                await asyncio.sleep(0.5)
                assert "r1-s0-e1-r1" in live(cluster, "v1/pods")
            await roll_out_gateway(cluster)
            started = time.monotonic()
            await eventually(lambda: "r1-s0-e1-r1" not in live(cluster, "v1/pods"), 30,
                             "replica 1's pod deleted once its sessions ended")
            assert time.monotonic() - started < DRAIN_SECONDS
            assert sorted(live(cluster, "v1/pods")) == ["r1-s0-e1"]
            await eventually(lambda: any("its sessions ended" in e["message"]
                                         for e in cluster.live("v1/events", NS)), 10,
                             "the event saying why it went")
