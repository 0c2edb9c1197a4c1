"""Two controllers write a ShardRoute's conditions: the planner (Ready, Progressing,
Degraded) and the Tracker daemon (Certified), each through the executor with its own
condition types. A planner write computed from a read taken before the daemon's write
once put back the conditions list of that read, and Certified was lost until the
daemon's next pass. Against the emulator over HTTP, as the API server would answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from meshnet.certify.decide import CERTIFIED, Decision
from meshnet.devtools.cluster import Emulator, emulated_cluster
from meshnet.errors import KubeApiError
from meshnet.operator.executor import execute
from meshnet.operator.kube import Connection, KubeClient
from meshnet.reconcile.conditions import Verdict
from meshnet.reconcile.plan import Plan
from meshnet.reconcile.route.status import OWN_CONDITIONS
from meshnet.tracker.planner import STATUS_KEYS, Shown, plan_pass

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
    # In the order the route had them, the planner's new ones last.
    assert fresh["status"]["conditions"] == [ours[0], certified, *ours[1:]]


async def test_a_daemon_write_from_a_stale_read_keeps_the_planners_conditions(
        cluster: tuple[Emulator, KubeClient]) -> None:
    _, client = cluster
    stale = await client.get(ROUTE)
    assert stale is not None
    # The planner writes after the daemon's pass read the route...
    ours = [condition("Ready", "False", "StagesNotReady"),
            condition("Progressing", "True", "StagesStarting")]
    await execute(client, stale, "shardroutes",
                  Plan(status={"conditions": ours}, own_conditions=OWN_CONDITIONS),
                  ["conditions"])
    # ...and the daemon writes what its pass decided from that read.
    await execute(client, stale, "shardroutes", daemon_plan(stale, "NoCertifier"), STATUS_KEYS)

    fresh = await client.get(ROUTE)
    assert fresh is not None
    assert [(c["type"], c["reason"]) for c in fresh["status"]["conditions"]] == [
        ("Ready", "StagesNotReady"), ("Progressing", "StagesStarting"),
        ("Certified", "NoCertifier")]


async def test_the_planner_and_the_daemon_writing_at_once_never_lose_each_others_conditions(
        cluster: tuple[Emulator, KubeClient]) -> None:
    """Both read the route, then both write at once, round after round: one write lands
    first and the other is refused as stale, redone on a fresh read, and lands too."""
    _, client = cluster
    for round_ in range(6):
        read = await client.get(ROUTE)
        assert read is not None
        ours = [condition("Ready", "False", f"Planned{round_}"),
                condition("Progressing", "True", f"Planned{round_}"),
                condition("Degraded", "False", f"Planned{round_}")]
        planner = Plan(status={"conditions": ours}, own_conditions=OWN_CONDITIONS)
        await asyncio.gather(
            execute(client, read, "shardroutes", planner, ["conditions"]),
            execute(client, read, "shardroutes", daemon_plan(read, f"Certifying{round_}"),
                    STATUS_KEYS))

        fresh = await client.get(ROUTE)
        assert fresh is not None
        reasons = {c["type"]: c["reason"] for c in fresh["status"]["conditions"]}
        assert reasons == {"Ready": f"Planned{round_}", "Progressing": f"Planned{round_}",
                           "Degraded": f"Planned{round_}", CERTIFIED: f"Certifying{round_}"}
        assert len(fresh["status"]["conditions"]) == 4

    # Settled: each writer, planning the same again, finds nothing to write (the two agree
    # on the list's order, so neither undoes the other's write forever).
    settled = await client.get(ROUTE)
    assert settled is not None
    await execute(client, settled, "shardroutes", planner, ["conditions"])
    await execute(client, settled, "shardroutes", daemon_plan(settled, "Certifying5"),
                  STATUS_KEYS)
    again = await client.get(ROUTE)
    assert again is not None
    assert again["metadata"]["resourceVersion"] == settled["metadata"]["resourceVersion"]


async def test_a_write_redone_after_a_conflict_is_dropped_when_what_it_rests_on_moved(
        cluster: tuple[Emulator, KubeClient]) -> None:
    _, client = cluster
    stale = await client.get(ROUTE)
    assert stale is not None
    # The route turns Ready after the daemon's pass read it as not Ready...
    await client.patch(f"{ROUTE}/status", {"status": {"conditions": [
        condition("Ready", "True", "AllStagesReady")]}})

    def ready(route: Mapping[str, Any]) -> str | None:
        return next(c["status"] for c in route["status"]["conditions"] if c["type"] == "Ready")

    # ...so its write, refused as stale, is not redone: the next pass decides anew.
    await execute(client, stale, "shardroutes", daemon_plan(stale, "CertificationPending"),
                  STATUS_KEYS, still_current=lambda fresh: ready(fresh) == ready(stale))

    fresh = await client.get(ROUTE)
    assert fresh is not None
    assert [c["type"] for c in fresh["status"]["conditions"]] == ["Ready"]


def daemon_plan(route: Mapping[str, Any], reason: str) -> Plan:
    """A daemon pass's plan whose Certified condition says `reason`."""
    decision = Decision(Verdict(CERTIFIED, False, reason, "lane cpu"), None)
    plan = plan_pass(route, decision, None, Shown(None, None, None),
                     datetime(2026, 12, 6, 12, tzinfo=UTC))
    assert plan.own_conditions == (CERTIFIED,)
    return plan


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
