"""The operator reports real workers to a loopback Tracker: kopf over kmock's emulator, a
kubelet stand-in running each stage pod as a real worker, and a Job stand-in running the
certification Job's `meshnet certify`. Must show: reports of a certified route, every one
valid against the published JSON schema; and a down Tracker costs retries and a failure
metric, never the reconcile; and a route whose last stage verified drafts shows its
acceptance in status."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from meshnet.certify.gates import Gates
from meshnet.devtools.cluster import Emulator, emulated_cluster, eventually, running_operator
from meshnet.devtools.tracker import LoopbackTracker
from meshnet.local.process import free_port
from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator.settings import OperatorSettings
from meshnet.paths import repo_root
from meshnet.route import Generation, RouteDriver
from meshnet.route.route_key import RouteSecret
from meshnet.route.stage import StageClient, TlsFiles
from meshnet.tracker.client import RetryPolicy
from meshnet.tracker.schema import SCHEMA_FILE
from meshnet.tracker.settings import TrackerSettings
from meshnet.tracker.validate import report_errors

from .conftest import TOKEN
from .standins import (
    NS,
    JobController,
    Kubelet,
    artifact,
    declare_jobs_and_nodes,
    gateway_identity,
    route_secret,
    running,
)

ROUTES = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/shardroutes"
ARTIFACTS = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/modelartifacts"
FAST = RetryPolicy(attempts=3, base_seconds=0.05, cap_seconds=0.2, timeout_seconds=2.0)
# The route's speed is measured and reported but not gated: on a shared machine a split
# route's speed over the unsplit one's is a figure of the load (tests/certify/conftest.py),
# and a gate failed by chance left the route unadvertised past the wait. One short decode
# per side is enough to report it.
GATES = Gates(speed_fraction=0.0, speed_tokens=16, repeats=1)
# How long a certification may take: a liveness bound (a route never advertised fails
# either way), wide enough for a loaded machine, where the route decodes at ~1 token/s.
CERTIFIED_WITHIN = 240


def settings(tracker_url: str, certify: bool = True) -> OperatorSettings:
    return OperatorSettings(
        worker_images={"cpu": "meshnet/worker-cpu:test"}, pin_digest="p" * 64,
        metrics_port=0, health_port=0, worker_grpc_port=free_port(),
        tracker_url=tracker_url, tracker_token=TOKEN,
        tracker=TrackerSettings(
            provider_id="test-provider", cluster_id="test-cluster", sample_seconds=0.3,
            report_seconds=2.0, stage_timeout_seconds=2.0, retry=FAST,
            certify_images={"cpu": "meshnet/certify:cpu"} if certify else {}, gates=GATES))


def route_body(ranges: list[tuple[int, int]], context: int = 1024) -> dict[str, Any]:
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ShardRoute",
            "metadata": {"name": "r1", "namespace": NS},
            "spec": {"artifactRef": {"name": "smollm2"},
                     "recipe": {"lane": "cpu", "contextLength": context, "sessionSlots": 2},
                     "stages": [{"name": f"s{i}", "layers": {"begin": b, "end": e}}
                                for i, (b, e) in enumerate(ranges)]}}


@pytest.fixture
async def cluster() -> AsyncIterator[Emulator]:
    async with emulated_cluster() as emulator:
        declare_jobs_and_nodes(emulator)
        yield emulator


async def start_route(cluster: Emulator, model: Path, ranges: list[tuple[int, int]]) -> None:
    body = artifact(model)
    response = await cluster.post(ARTIFACTS, json={k: v for k, v in body.items()
                                                   if k != "status"})
    assert response.status == 200, await response.text()
    await cluster.patch(f"{ARTIFACTS}/smollm2/status", json={"status": body["status"]})
    response = await cluster.post(ROUTES, json=route_body(ranges))
    assert response.status == 200, await response.text()


def route(cluster: Emulator) -> dict[str, Any]:
    found = [r for r in cluster.live("meshnet.dev/v1alpha1/shardroutes", NS)
             if r["metadata"]["name"] == "r1"]
    return found[0] if found else {}


def condition(kind: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def find(body: dict[str, Any]) -> dict[str, Any]:
        return next((c for c in (body.get("status") or {}).get("conditions") or []
                     if c["type"] == kind), {})
    return find


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def reports_until(tracker: LoopbackTracker, check: Callable[[list[Any]], bool],
                        timeout: float, what: str) -> list[Any]:
    try:
        await eventually(lambda: check(tracker.accepted()), timeout, what)
    except AssertionError as exc:  # say what the Tracker was told last (a failed certificate?)
        last = (tracker.accepted() or [{}])[-1]
        raise AssertionError(f"{exc}; last report: epoch {last.get('route', {}).get('epoch')}, "
                             f"available {last.get('available')}, reasons "
                             f"{last.get('unavailableReasons')}") from None
    return tracker.accepted()


def reasons(report: dict[str, Any]) -> list[str]:
    return [r["reason"] for r in report["unavailableReasons"]]


async def test_the_operator_advertises_a_certified_route_and_a_recipe_change_withdraws_it(
        cluster: Emulator, tracker: LoopbackTracker, shard_worker: Path, smollm2: Path,
        tmp_path: Path) -> None:
    metrics = OperatorMetrics()
    kubelet = Kubelet(cluster, shard_worker, smollm2, tmp_path)
    jobs = JobController(cluster, shard_worker, smollm2, tmp_path)
    async with running_operator(cluster, settings(tracker.url), metrics), \
            running(kubelet, jobs):
        await start_route(cluster, smollm2, [(0, 10), (10, 20), (20, 30)])
        reports = await reports_until(tracker, lambda rs: any(r["available"] for r in rs),
                                      CERTIFIED_WITHIN, "a report saying available")

        first = reports[0]
        assert not first["available"] and "LaneNotCertified" in reasons(first)
        latest = reports[-1]
        await eventually(lambda: condition("Certified")(route(cluster)).get("status") == "True",
                         30, "the Certified condition")  # status follows the report
        body = route(cluster)
        assert condition("Certified")(body)["reason"] == "LaneCertified"
        assert body["status"]["certification"]["passed"]
        assert body["status"]["tracker"]["available"]
        assert jobs.ran == [next(iter(j["metadata"]["name"]
                                      for j in cluster.live("batch/v1/jobs", NS)))]

        # Real figures: the workers the kubelet stand-in runs, dialled at their pod IPs
        # (over mTLS: a route's stages take only its own identities).
        tls = gateway_identity(cluster, "r1", tmp_path / "gateway")
        pods = {p["metadata"]["name"]: p for p in cluster.live("v1/pods", NS)
                if "meshnet.dev/stage" in p["metadata"].get("labels", {})}
        for stage, pod_name in zip(latest["stages"], ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"],
                                   strict=True):
            address = pods[pod_name]["status"]["podIP"]
            assert stage["endpoint"].startswith(f"{address}:")
            client = StageClient(stage["endpoint"], tls)
            assert stage["health"]["incarnation"] == client.info().incarnation
            client.close()
            assert stage["capacity"]["sessionSlotsTotal"] == 2
            assert stage["capacity"]["kvTokensTotal"] == 2 * 1024
        assert latest["route"]["routeDigest"] == body["status"]["routeDigest"]
        assert latest["provider"] == {"id": "test-provider", "cluster": "test-cluster"}
        assert latest["certification"]["certificate"]["parity"]["maxAbsDeltaLogit"] == 0.0
        assert latest["capacity"]["sessionSlotsAdvertised"] == 2

        # A recipe change is a new lane: withdrawn at once, certified again, advertised again.
        before = len(reports)
        await cluster.patch(f"{ROUTES}/r1", json={"spec": {"recipe": {"contextLength": 768}}})
        reports = await reports_until(
            tracker, lambda rs: len(rs) > before and rs[-1]["available"]
            and rs[-1]["route"]["epoch"] == 2, CERTIFIED_WITHIN, "epoch 2 advertised again")
        withdrawn = [r for r in reports[before:] if not r["available"]]
        assert withdrawn and "LaneNotCertified" in reasons(withdrawn[0])
        assert any("certificate is for another lane (recipeDigest" in u["message"]
                   for r in withdrawn for u in r["unavailableReasons"])
        assert len(jobs.ran) == 2

        published = json.loads((repo_root() / SCHEMA_FILE).read_text())
        for report in tracker.accepted():
            assert report_errors(report, published) == []
        assert {r.headers["Authorization"] for r in tracker.received} == {f"Bearer {TOKEN}"}
        assert sample(metrics, "meshnet_certifications_total", result="passed") == 2
        assert sample(metrics, "meshnet_tracker_routes_available") == 1
        assert sample(metrics, "meshnet_tracker_reports_failed_total", reason="transport") == 0

        # Deleting the route withdraws it from the Tracker.
        await cluster.delete(f"{ROUTES}/r1")
        reports = await reports_until(tracker, lambda rs: reasons(rs[-1]) == ["RouteDeleted"],
                                      30, "the route withdrawn")
        assert reports[-1]["capacity"]["sessionSlotsAdvertised"] == 0
        assert report_errors(reports[-1], published) == []


async def test_a_tracker_that_is_down_costs_retries_and_a_failure_metric_never_the_reconcile(
        cluster: Emulator, shard_worker: Path, smollm2: Path, tmp_path: Path) -> None:
    down = LoopbackTracker(token=TOKEN, port=free_port())  # nothing listens there yet
    metrics = OperatorMetrics()
    kubelet = Kubelet(cluster, shard_worker, smollm2, tmp_path)
    operator_settings = settings(down.url, certify=False)
    async with running_operator(cluster, operator_settings, metrics), running(kubelet):
        await start_route(cluster, smollm2, [(0, 15), (15, 30)])
        await eventually(lambda: sample(metrics, "meshnet_tracker_reports_failed_total",
                                        reason="transport") >= 2, 60, "failed reports")
        assert sample(metrics, "meshnet_tracker_report_retries_total") >= 4
        assert sample(metrics, "meshnet_tracker_reports_sent_total") == 0
        await eventually(lambda: (route(cluster).get("status") or {}).get(
            "tracker", {}).get("deliveryError"), 30, "the delivery error in status")
        assert "ConnectError" in route(cluster)["status"]["tracker"]["deliveryError"]
        await eventually(lambda: condition("Certified")(route(cluster)).get("reason")
                         == "NoCertifier", 30, "Certified to say there is no certifier")

        # The reconcile goes on regardless: a new layout rolls out to epoch 2.
        await cluster.patch(f"{ROUTES}/r1", json={"spec": {"stages": [
            {"name": "s0", "layers": {"begin": 0, "end": 12}},
            {"name": "s1", "layers": {"begin": 12, "end": 30}}]}})
        # (the old epoch serves, and the route is Ready, until epoch 2 takes over)
        await eventually(lambda: condition("Ready")(route(cluster)).get("status") == "True"
                         and route(cluster)["status"]["epoch"] == 2
                         and route(cluster)["status"].get("updatedReplicas") == 1, 60,
                         "epoch 2 Ready")

        # The Tracker comes back on the same address: reports flow, unadvertised (no
        # certificate), and the delivery error clears.
        with down:
            reports = await reports_until(down, lambda rs: bool(rs), 30, "a report")
            assert not reports[-1]["available"]
            assert "LaneNotCertified" in reasons(reports[-1])
            await eventually(lambda: "deliveryError" not in route(cluster)["status"]["tracker"],
                             30, "the delivery error to clear")
            assert "speculation" not in route(cluster)["status"]  # nothing verified yet

            # A client speculating over the hub by itself: the last stage verifies its
            # drafts, and the status shows what they achieved.
            endpoints = [f"{kubelet.addresses[pod]}:{operator_settings.worker_grpc_port}"
                         for pod in ("r1-s0-e2", "r1-s1-e2")]
            tls = gateway_identity(cluster, "r1", tmp_path / "gateway")
            key = route_secret(cluster, "r1", tmp_path / "gateway")
            generation = await asyncio.to_thread(speculate, endpoints, tls, key)
            await eventually(lambda: (route(cluster)["status"].get("speculation") or {}).get(
                "draftTokensVerified") == generation.draft_tokens, 30, "status.speculation")
            shown = route(cluster)["status"]["speculation"]
            assert shown == {"acceptance": round(
                generation.accepted_draft_tokens / generation.draft_tokens, 3),
                "draftTokensVerified": generation.draft_tokens,
                "draftTokensAccepted": generation.accepted_draft_tokens}
            assert generation.accepted_draft_tokens > 0
        assert sample(metrics, "meshnet_tracker_reports_sent_total") >= 1


CODE = (  # code the model goes on repeating: prompt-lookup drafts hold
    "# Original:\ndef sum_list(values):\n    total = 0\n    for value in values:\n"
    "        total = total + value\n    return total\n\ndef mean(values):\n"
    "    total = sum_list(values)\n    return total / len(values)\n\n"
    "# The same code with type hints added:\ndef sum_list(values: list[float]) -> float:\n"
)


def speculate(endpoints: list[str], tls: TlsFiles, route_key: RouteSecret) -> Generation:
    with RouteDriver(endpoints, topology="hub", speculate=4, tls=tls,
                     route_key=route_key) as driver:
        return driver.generate(CODE, max_tokens=48, stop_at_eos=False)
