"""Two controllers write a ShardRoute's conditions: the planner (Ready, Progressing,
Degraded) and the Tracker daemon (Certified). A planner write computed from a read taken
before the daemon's write once put back the conditions list of that read, and Certified
was lost until the daemon's next pass. Against the emulator over HTTP, as the API server
would answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from meshnet.devtools.cluster import Emulator, emulated_cluster
from meshnet.errors import KubeApiError
from meshnet.operator.executor import execute
from meshnet.operator.kube import Connection, KubeClient
from meshnet.reconcile.plan import Plan
from meshnet.reconcile.route.status import OWN_CONDITIONS

from .conftest import MakeRoute

NS = "default"
ROUTE = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/shardroutes/r1"


def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": "",
            "lastTransitionTime": "2026-12-06T12:00:00Z"}


@pytest.fixture
async def cluster(make_route: MakeRoute) -> AsyncIterator[tuple[Emulator, KubeClient]]:
    async with emulated_cluster() as emulator:
        client = KubeClient(Connection(server=str(emulator.url).rstrip("/")))
        body = make_route()
        body["metadata"] = {"name": "r1", "namespace": NS}
        await client.create(ROUTE.rsplit("/", 1)[0], body)
        await client.patch(f"{ROUTE}/status", {"status": {"conditions": [
            condition("Ready", "False", "StagesNotReady")]}})
        yield emulator, client
        await client.close()


async def test_a_planner_write_from_a_stale_read_keeps_the_daemons_condition(
        cluster: tuple[Emulator, KubeClient]) -> None:
    _, client = cluster
    stale = await client.get(ROUTE)
    assert stale is not None
    # The daemon certifies the route after the planner read it...
    certified = condition("Certified", "True", "LaneCertified")
    await client.patch(f"{ROUTE}/status", {"status": {"conditions": [
        *stale["status"]["conditions"], certified]}})
    # ...and the planner writes what it decided from its read, others' conditions included.
    ours = [condition("Ready", "True", "AllStagesReady"),
            condition("Progressing", "False", "RolloutComplete"),
            condition("Degraded", "False", "AsExpected")]
    plan = Plan(status={"conditions": ours}, own_conditions=OWN_CONDITIONS)
    await execute(client, stale, "shardroutes", plan, ["conditions"])

    fresh = await client.get(ROUTE)
    assert fresh is not None
    assert fresh["status"]["conditions"] == [*ours, certified]


async def test_a_write_from_a_stale_read_is_refused_as_the_api_server_does(
        cluster: tuple[Emulator, KubeClient]) -> None:
    _, client = cluster
    stale = await client.get(ROUTE)
    assert stale is not None
    await client.patch(f"{ROUTE}/status", {"status": {"epoch": 2}})
    version = stale["metadata"]["resourceVersion"]
    with pytest.raises(KubeApiError) as refused:
        await client.patch(f"{ROUTE}/status", {"metadata": {"resourceVersion": version},
                                               "status": {"epoch": 3}})
    assert refused.value.status == 409
    fresh = await client.get(ROUTE)
    assert fresh is not None and fresh["status"]["epoch"] == 2
