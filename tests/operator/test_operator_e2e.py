"""The real kopf operator end to end against kmock's KubernetesEmulator over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509

from meshnet.api.certification import CertifiedLane
from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.certify.gates import Gates
from meshnet.certify.job import JobInputs, certification_job
from meshnet.devtools.cluster import (
    Emulator,
    emulated_cluster,
    eventually,
    mark_pods,
    operator_process,
    running_operator,
)
from meshnet.devtools.kube_tools import install
from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator.settings import OperatorSettings
from meshnet.paths import repo_root
from meshnet.reconcile.route.podspec import RouteRef
from meshnet.tracker.settings import TrackerSettings

MakeArtifact = MakeRoute = Callable[..., dict[str, Any]]  # fixtures from conftest.py
NS = "default"
ROUTES = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/shardroutes"
ARTIFACTS = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/modelartifacts"
SETTINGS = OperatorSettings(worker_images={"cpu": "meshnet/worker-cpu:test"},
                            pin_digest="p" * 64, metrics_port=0, health_port=0,
                            gateway_image="meshnet/operator:test")


@pytest.fixture
async def cluster() -> AsyncIterator[Emulator]:
    async with emulated_cluster() as emulator:
        yield emulator


@pytest.fixture
async def metrics(cluster: Emulator) -> AsyncIterator[OperatorMetrics]:
    metrics = OperatorMetrics()
    async with running_operator(cluster, SETTINGS, metrics):
        yield metrics


def pods(cluster: Emulator) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.live("v1/pods", NS)}


def route(cluster: Emulator, name: str = "r1") -> dict[str, Any]:
    found = [r for r in cluster.live("meshnet.dev/v1alpha1/shardroutes", NS)
             if r["metadata"]["name"] == name]
    return found[0] if found else {}


def condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def event_reasons(cluster: Emulator) -> list[str]:
    return [e["reason"] for e in cluster.live("v1/events", NS)]


async def create(cluster: Emulator, url: str, body: dict[str, Any]) -> None:
    body = {k: v for k, v in body.items() if k != "status"} | {"metadata": {
        k: v for k, v in body["metadata"].items() if k not in ("uid", "generation")}}
    response = await cluster.post(url, json=body)
    assert response.status == 200, await response.text()


async def ready_route(cluster: Emulator, make_route: MakeRoute, make_artifact: MakeArtifact,
                      **route_args: Any) -> None:
    artifact = make_artifact()
    await create(cluster, ARTIFACTS, artifact)
    await cluster.patch(f"{ARTIFACTS}/smollm2/status", json={"status": artifact["status"]})
    await create(cluster, ROUTES, make_route(**route_args))
    count = 3 * route_args.get("replicas", 1)
    await eventually(lambda: len(pods(cluster)) == count, what=f"{count} stage pods")
    await mark_pods(cluster, NS)
    await eventually(lambda: condition(route(cluster), "Ready").get("status") == "True",
                     what="the route to be Ready")


WRITES = ("create", "patch", "put", "delete")


def writes(calls: Counter[str]) -> Counter[str]:
    return Counter({call: n for call, n in calls.items() if call.split()[0] in WRITES})


async def test_a_ready_route_makes_no_api_writes_over_several_resync_periods(
        cluster: Emulator, make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    resync = 0.5  # the periodic reconcile, and twice per period the Tracker daemon's pass
    settings = dataclasses.replace(SETTINGS, resync_seconds=resync,
                                   tracker=TrackerSettings(sample_seconds=resync / 2))
    metrics = OperatorMetrics()
    reconciles = metrics.reconciles.labels("ShardRoute")
    async with running_operator(cluster, settings, metrics):
        await ready_route(cluster, make_route, make_artifact)
        await eventually(lambda: bool(condition(route(cluster), "Certified")),
                         what="the daemon's Certified condition")
        await until_quiet(cluster, resync)  # the daemon's first word on the Ready route
        calls, runs = Counter(cluster.calls), reconciles._value.get()
        await asyncio.sleep(4 * resync)
        made = cluster.calls - calls
    assert reconciles._value.get() - runs >= 3  # the resyncs did run
    assert writes(made) == Counter()
    assert set(made) == {"get shardroutes"}  # each resync reads the route; nothing else


async def test_quiet_routes_cost_no_periodic_work_per_route(
        cluster: Emulator, make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    """With nothing changing, no route is reconciled, no API request is made, and each
    route's daemon asks its stages at most once in many sample periods (once per quiet
    period): idle cost follows what changes, not how many routes there are."""
    sample, routes = 0.1, 3
    settings = dataclasses.replace(SETTINGS, tracker=TrackerSettings(
        sample_seconds=sample, report_seconds=30.0, stage_timeout_seconds=sample))
    metrics = OperatorMetrics()

    def asked() -> float:  # every stage of every pass: KMock's pods run no worker
        return metrics.registry.get_sample_value(
            "meshnet_tracker_stage_collect_errors_total") or 0.0

    async with running_operator(cluster, settings, metrics):
        artifact = make_artifact()
        await create(cluster, ARTIFACTS, artifact)
        await cluster.patch(f"{ARTIFACTS}/smollm2/status", json={"status": artifact["status"]})
        for i in range(routes):
            await create(cluster, ROUTES, make_route(f"r{i}"))
        await eventually(lambda: len(pods(cluster)) == 3 * routes, what="the stage pods")
        await mark_pods(cluster, NS)
        await eventually(lambda: all(condition(route(cluster, f"r{i}"), "Certified")
                                     for i in range(routes)), what="every daemon's word")
        await until_quiet(cluster, 10 * sample)
        calls, reconciles, before = Counter(cluster.calls), metrics.reconciles, asked()
        runs = reconciles.labels("ShardRoute")._value.get()
        await asyncio.sleep(20 * sample)
        made, sampled = cluster.calls - calls, asked() - before
    assert before > 0  # the daemons did ask the stages while the routes changed
    assert reconciles.labels("ShardRoute")._value.get() == runs
    assert made == Counter()
    # Every sample period this would be 20 passes x 3 stages per route.
    assert sampled <= routes * 3, f"{sampled:.0f} stage samples in 20 quiet sample periods"


async def test_events_that_show_the_planner_nothing_new_do_not_reconcile(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    """What a re-opened watch replays, or a change to what no route reads, is skipped: a
    replay once reconciled every route again (kmock replays every object on a new watch)."""
    await ready_route(cluster, make_route, make_artifact)
    skipped = metrics.triggers.labels
    before = {k: skipped(k)._value.get() for k in ("pod-unchanged", "artifact-unchanged")}
    runs = metrics.reconciles.labels("ShardRoute")._value.get()
    for name in pods(cluster):
        await cluster.patch(f"/api/v1/namespaces/{NS}/pods/{name}",
                            json={"metadata": {"annotations": {"note": "x"}}})
    await cluster.patch(f"{ARTIFACTS}/smollm2", json={"metadata": {"labels": {"team": "a"}}})
    await eventually(lambda: skipped("pod-unchanged")._value.get()
                     == before["pod-unchanged"] + 3
                     and skipped("artifact-unchanged")._value.get()
                     == before["artifact-unchanged"] + 1, what="the four events handled")
    assert metrics.reconciles.labels("ShardRoute")._value.get() == runs


async def until_quiet(cluster: Emulator, seconds: float, timeout: float = 10.0) -> None:
    """Wait for `seconds` in a row without a write to the API (fail after `timeout`)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        before = writes(cluster.calls)
        await asyncio.sleep(seconds)
        if writes(cluster.calls) == before:
            return
        assert asyncio.get_running_loop().time() < deadline, writes(cluster.calls) - before


async def test_an_artifact_and_a_route_become_stage_pods_and_a_headless_service(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    await ready_route(cluster, make_route, make_artifact)
    found = pods(cluster)
    assert sorted(found) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
    worker = found["r1-s1-e1"]["spec"]["containers"][0]
    assert worker["image"] == "meshnet/worker-cpu:test"
    args = worker["args"]
    assert args[args.index("--layers") + 1] == "10:20"
    assert args[args.index("--epoch") + 1] == "1"
    assert args[args.index("--model") + 1] == "/models/model-00001-of-00002.gguf"
    assert not any(links(pod) for pod in found.values())  # hub, the default: no stage relays
    assert found["r1-s1-e1"]["metadata"]["ownerReferences"][0]["name"] == "r1"
    services = {s["metadata"]["name"]: s for s in cluster.live("v1/services", NS)}
    assert sorted(services) == ["r1-gateway", "r1-workers"]
    assert services["r1-workers"]["spec"]["clusterIP"] == "None"
    status = route(cluster)["status"]
    assert status["epoch"] == 1 and status["stagesReady"] == "3/3"
    assert status["coverage"] == "0-30/30"
    assert "EpochAdvanced" in event_reasons(cluster)
    assert event_reasons(cluster).count("StagePodCreated") == 1  # naming the three pods
    # the handler counts and sets the gauges after the status write a test sees first
    await eventually(lambda: metrics.epoch_advances._value.get() == 1
                     and metrics.routes.labels("Ready", "True")._value.get() == 1,
                     what="the epoch advance counted and the route counted Ready")


def gateway_pods(cluster: Emulator) -> list[list[dict[str, Any]]]:
    """Per replica the gateway is given, the stage pods its addresses name (as DNS would
    resolve them: hostname.subdomain); a name no pod has is missing from its list."""
    args = gateway(cluster)["spec"]["template"]["spec"]["containers"][0]["args"]
    pairs = list(itertools.pairwise(args))
    groups = [[v for k, v in pairs if k == "--stage"]] if "--stage" in args else [
        v.split(",") for k, v in pairs if k == "--replica"]
    by_host = {f"{p['spec']['hostname']}.{p['spec']['subdomain']}": p
               for p in pods(cluster).values()}
    return [[by_host[h] for a in group if (h := ".".join(a.split(".")[:2])) in by_host]
            for group in groups]


def serving_replicas(cluster: Emulator, stages: int) -> int:
    """Replicas whose gateway-named stage pods are all there and Ready."""
    return sum(1 for group in gateway_pods(cluster) if len(group) == stages and all(
        condition(p, "Ready").get("status") == "True" for p in group))


@pytest.mark.parametrize("replicas", [1, 2])
async def test_a_resplit_rolls_replica_by_replica_and_a_replica_is_ready_at_every_change(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact, replicas: int) -> None:
    """maxSurge 1: each replica's new pipeline starts beside the old one, the gateway
    switches to it once it is Ready, and the old one drains; sampled at every API write,
    the gateway always names a ready pipeline and the route never stops being Ready."""
    await ready_route(cluster, make_route, make_artifact, replicas=replicas,
                      rollout={"drainSeconds": 1})
    await mark_pods(cluster, NS)
    await eventually(lambda: route(cluster)["status"].get("readyReplicas") == replicas,
                     what="every replica ready")
    samples: list[tuple[int, str, int]] = []  # (serving replicas, Ready, pods)

    def sample() -> None:
        samples.append((serving_replicas(cluster, 3),
                        condition(route(cluster), "Ready").get("status", ""),
                        len(pods(cluster))))

    cluster.on_write.append(sample)
    stages = make_route(ranges=[(0, 12), (12, 20), (20, 30)])["spec"]["stages"]
    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"stages": stages}})
    await eventually(lambda: sum("-e2" in n for n in pods(cluster)) >= 3,
                     what="epoch 2's first pipeline")
    assert "r1-s0-e1" in pods(cluster)  # beside the old one, which still serves
    new = [n for n in pods(cluster) if "-e2" in n]
    assert len(new) == 3  # one replica at a time (maxSurge 1)

    async def kubelet() -> bool:
        # (done only once every pod it sees is Ready: a replica's new pods may appear
        # after the old ones are gone, maxUnavailable 1 allowing it)
        await mark_pods(cluster, NS)
        now = pods(cluster)
        return (all("-e2" in n for n in now) and len(now) == 3 * replicas
                and all(condition(p, "Ready").get("status") == "True" for p in now.values()))

    for _ in range(200):
        if await kubelet():
            break
        await asyncio.sleep(0.1)
    expected = sorted(f"r1-s{n}-e2" + (f"-r{r}" if r else "")
                      for n in range(3) for r in range(replicas))
    assert sorted(pods(cluster)) == expected
    await eventually(lambda: route(cluster)["status"].get("updatedReplicas") == replicas
                     and condition(route(cluster), "Progressing").get("status") == "False",
                     what="the rollout complete")
    cluster.on_write.remove(sample)
    assert len(samples) > 10
    assert all(serving >= 1 for serving, _, _ in samples), samples
    assert all(ready == "True" for _, ready, _ in samples), samples
    assert max(count for _, _, count in samples) <= 3 * (replicas + 1)  # the surge
    status = route(cluster)["status"]
    assert status["epoch"] == 2 and {s["epoch"] for s in status["stages"]} == {2}
    reasons = event_reasons(cluster)
    assert reasons.count("PipelineDraining") == replicas
    assert reasons.count("StagePodReplaced") == replicas


async def test_a_label_change_does_not_start_a_new_epoch(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    await ready_route(cluster, make_route, make_artifact)
    before = metrics.reconciles.labels("ShardRoute")._value.get()
    await cluster.patch(f"{ROUTES}/r1", json={"metadata": {"labels": {"team": "serving"}}})
    await eventually(lambda: metrics.reconciles.labels("ShardRoute")._value.get() > before,
                     what="a reconcile of the relabelled route")
    assert route(cluster)["status"]["epoch"] == 1
    assert sorted(pods(cluster)) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
    assert event_reasons(cluster).count("EpochAdvanced") == 1


async def test_a_deleted_route_leaves_no_children(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    await ready_route(cluster, make_route, make_artifact)
    await cluster.delete(f"{ROUTES}/r1")
    await eventually(lambda: not pods(cluster) and not list(cluster.live("v1/services", NS))
                     and not list(cluster.live("apps/v1/deployments", NS))
                     and not route(cluster), what="pods, services, gateway and route to be gone")


def gateway(cluster: Emulator) -> dict[str, Any]:
    found = list(cluster.live("apps/v1/deployments", NS))
    assert len(found) <= 1
    return found[0] if found else {}


async def test_a_route_gets_a_gateway_that_follows_its_spec(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    await ready_route(cluster, make_route, make_artifact)
    deployment = gateway(cluster)
    assert deployment["metadata"]["name"] == "r1-gateway"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "meshnet/operator:test" and container["args"][0] == "serve"
    args = container["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--stage"] == [
        f"s{n}-e1.r1-workers.{NS}.svc:50051" for n in range(3)]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert pod["securityContext"]["runAsNonRoot"] and \
        container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    service = next(s for s in cluster.live("v1/services", NS)
                   if s["metadata"]["name"] == "r1-gateway")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    workers = next(s for s in cluster.live("v1/services", NS)
                   if s["metadata"]["name"] == "r1-workers")
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert not set(workers["spec"]["selector"].items()) <= set(template_labels.items())
    assert route(cluster)["status"]["endpoint"] == f"http://r1-gateway.{NS}.svc:8000/v1"

    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"gateway": {
        "replicas": 2, "resources": {"requests": {"cpu": "1"}}}}})
    await eventually(lambda: gateway(cluster).get("spec", {}).get("replicas") == 2,
                     what="the gateway scaled to 2")
    requests = gateway(cluster)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert requests["requests"] == {"cpu": "1", "memory": "256Mi"}
    assert route(cluster)["status"]["epoch"] == 1  # the gateway is not part of the identity

    def serve_flags() -> dict[str, str]:
        args = gateway(cluster)["spec"]["template"]["spec"]["containers"][0]["args"]
        return {a: args[i + 1] for i, a in enumerate(args) if a in ("--speculate", "--windows")}

    assert serve_flags() == {"--speculate": "0", "--windows": "1"}
    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"recipe": {"speculation": {
        "mode": "Lookup", "maxDrafts": 5, "maxWindows": 3}}}})
    await eventually(lambda: serve_flags() == {"--speculate": "5", "--windows": "3"},
                     what="the gateway speculating as the recipe allows")
    await eventually(lambda: all("--discard-depth" in p["spec"]["containers"][0]["args"]
                                 for p in pods(cluster).values()) and len(pods(cluster)) == 3,
                     what="the stage pods replaced with their rollback depth")
    assert sorted(pods(cluster)) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
    await mark_pods(cluster, NS)
    await eventually(lambda: condition(route(cluster), "Ready").get("status") == "True",
                     what="the route Ready again at the same epoch")
    assert route(cluster)["status"]["epoch"] == 1  # the same tokens: the same identity

    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"gateway": {"enabled": False}}})
    await eventually(lambda: not gateway(cluster) and "endpoint" not in route(cluster).get(
        "status", {}), what="the gateway to be removed")
    assert [s["metadata"]["name"] for s in cluster.live("v1/services", NS)] == ["r1-workers"]
    assert sorted(pods(cluster)) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]


LINKS = ("--next-stage", "--next-stage-ca", "--ring-last")


def links(pod: dict[str, Any]) -> dict[str, str]:
    args = pod["spec"]["containers"][0]["args"]
    return {flag: args[args.index(flag) + 1] for flag in LINKS if flag in args}


async def test_a_ring_route_links_its_stage_pods_over_tls_and_a_topology_change_relinks_them(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    await ready_route(cluster, make_route, make_artifact, tls={"secretName": "r1-tls"},
                      recipe={"lane": "cpu", "topology": "ring"})
    stage = [f"s{n}-e1.r1-workers.{NS}.svc:50051" for n in range(3)]
    ca = "/etc/meshnet/tls/ca.crt"
    assert {name: links(pod) for name, pod in pods(cluster).items()} == {
        "r1-s0-e1": {"--next-stage": stage[1], "--next-stage-ca": ca, "--ring-last": stage[2]},
        "r1-s1-e1": {"--next-stage": stage[2], "--next-stage-ca": ca},
        "r1-s2-e1": {}}
    args = gateway(cluster)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--stage"] == stage  # the same names
    assert "--topology" not in args  # auto: it drives the ring once the first stage is subscribed

    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"recipe": {"topology": "chain"}}})
    await eventually(lambda: {name: links(pod) for name, pod in pods(cluster).items()} == {
        "r1-s0-e1": {"--next-stage": stage[1], "--next-stage-ca": ca},
        "r1-s1-e1": {"--next-stage": stage[2], "--next-stage-ca": ca},
        "r1-s2-e1": {}}, what="the head pod started again without --ring-last")
    await mark_pods(cluster, NS)
    await eventually(lambda: condition(route(cluster), "Ready").get("status") == "True",
                     what="the relinked route to be Ready")
    assert route(cluster)["status"]["epoch"] == 1  # same tokens, same identity
    assert event_reasons(cluster).count("StagePodReplaced") == 1


def secret(cluster: Emulator, name: str) -> dict[str, bytes]:
    found = [s for s in cluster.live("v1/secrets", NS) if s["metadata"]["name"] == name]
    assert len(found) == 1, name
    assert found[0]["metadata"]["ownerReferences"][0]["uid"] == route(cluster)["metadata"]["uid"]
    return {k: base64.b64decode(v) for k, v in found[0]["data"].items()}


def mounted_files(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Where each Secret key the container sees lands: path -> Secret key (or name/*)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    files = {}
    for mount in container["volumeMounts"]:
        source = volumes[mount["name"]].get("secret")
        if source is None:
            continue
        for item in source.get("items") or [{"key": "*", "path": "*"}]:
            files[f"{mount['mountPath']}/{item['path']}"] = f"{source['secretName']}/{item['key']}"
    return files


def flags(args: list[str], *names: str) -> dict[str, str]:
    return {name: args[args.index(name) + 1] for name in names if name in args}


TLS_FLAGS = {"--tls-cert": "/etc/meshnet/tls/tls.crt", "--tls-key": "/etc/meshnet/tls/tls.key",
             "--tls-client-ca": "/etc/meshnet/tls/ca.crt"}


def role_files(role: str) -> dict[str, str]:
    return {"/etc/meshnet/tls/ca.crt": "r1-identity/ca.crt",
            "/etc/meshnet/tls/tls.crt": f"r1-identity/{role}.crt",
            "/etc/meshnet/tls/tls.key": f"r1-identity/{role}.key",
            "/etc/meshnet/route-key/route.key": "r1-identity/route.key"}


async def test_a_default_route_runs_every_link_on_mtls_from_its_own_ca_behind_a_network_policy(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    await ready_route(cluster, make_route, make_artifact, recipe={"lane": "cpu",
                                                                  "topology": "chain"})
    data = secret(cluster, "r1-identity")  # its own CA, owned by the route
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    for role in ("stage", "gateway", "certify", "operator"):
        x509.load_pem_x509_certificate(data[f"{role}.crt"]).verify_directly_issued_by(ca)
    assert len(data["route.key"]) == 64
    for name, pod in pods(cluster).items():  # every stage serves mTLS on the stage identity
        container = pod["spec"]["containers"][0]
        assert flags(container["args"], *TLS_FLAGS) == TLS_FLAGS, name
        assert mounted_files(pod["spec"], container) == role_files("stage"), name
        assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 9090}
    s0 = pods(cluster)["r1-s0-e1"]["spec"]["containers"][0]["args"]
    assert flags(s0, "--next-stage-ca") == {"--next-stage-ca": "/etc/meshnet/tls/ca.crt"}
    template = gateway(cluster)["spec"]["template"]["spec"]
    container = template["containers"][0]  # the gateway calls as the gateway identity
    assert flags(container["args"], "--tls-ca", "--tls-cert", "--tls-key") == {
        "--tls-ca": "/etc/meshnet/tls/ca.crt", "--tls-cert": "/etc/meshnet/tls/tls.crt",
        "--tls-key": "/etc/meshnet/tls/tls.key"}
    assert mounted_files(template, container) == role_files("gateway")
    # the certification Job the daemon would start from this route's first stage pod
    lane = CertifiedLane(backend="cpu", gpu_product="none", manifest_digest="a" * 64,
                         recipe_digest="b" * 64)
    job = certification_job(JobInputs(
        route=RouteRef("r1", NS, route(cluster)["metadata"]["uid"]), lane=lane,
        stage_pod=pods(cluster)["r1-s0-e1"], endpoints=["10.0.0.1:50051"], image="c:1",
        gates=Gates(), route_digest=None, epoch=1))["spec"]["template"]["spec"]
    certify = job["containers"][0]
    assert flags(certify["args"], "--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name") == {
        "--tls-ca": "/etc/meshnet/tls/ca.crt", "--tls-cert": "/etc/meshnet/tls/tls.crt",
        "--tls-key": "/etc/meshnet/tls/tls.key", "--tls-server-name": f"stage.r1.{NS}"}
    assert mounted_files(job, certify) == role_files("certify")
    # nothing mounts the CA's key
    assert not any("ca.key" in f for f in mounted_files(template, container).values())
    policies = list(cluster.live("networking.k8s.io/v1/networkpolicies", NS))
    assert [p["metadata"]["name"] for p in policies] == ["r1-stages"]
    spec = policies[0]["spec"]
    assert spec["podSelector"] == {"matchLabels": {"meshnet.dev/route": "r1"}}
    assert spec["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 50051}]
    assert [peer["podSelector"]["matchLabels"] for peer in spec["ingress"][0]["from"]][:3] == [
        {"meshnet.dev/route": "r1"}, {"meshnet.dev/gateway": "r1"},
        {"meshnet.dev/certify-route": "r1"}]

    # mode Disabled: plaintext, by choice; the policy stays
    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"tls": {"mode": "Disabled"}}})
    await eventually(lambda: all("--tls-cert" not in p["spec"]["containers"][0]["args"]
                                 for p in pods(cluster).values()) and len(pods(cluster)) == 3,
                     what="the stages restarted without TLS")
    assert [p["metadata"]["name"] for p in cluster.live(
        "networking.k8s.io/v1/networkpolicies", NS)] == ["r1-stages"]


@pytest.mark.parametrize(("ranges", "message"), [
    ([(0, 16), (16, 32)], "stage 's1' ends at layer 32 but the artifact has only 30 blocks"),
    ([(0, 15), (15, 29)],
     "stage 's1' ends at layer 29 but the artifact has 30 blocks: layer 29 would never run"),
])
async def test_a_route_beyond_or_short_of_the_models_layers_is_degraded_and_gets_no_pods(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact, ranges: list[tuple[int, int]], message: str) -> None:
    artifact = make_artifact(block_count=30)
    await create(cluster, ARTIFACTS, artifact)
    await cluster.patch(f"{ARTIFACTS}/smollm2/status", json={"status": artifact["status"]})
    await create(cluster, ROUTES, make_route(ranges=ranges))
    await eventually(lambda: condition(route(cluster), "Degraded").get("status") == "True")
    degraded = condition(route(cluster), "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert message in degraded["message"]
    assert pods(cluster) == {}
    await eventually(lambda: "InvalidSpec" in event_reasons(cluster), what="an InvalidSpec event")


async def test_a_ready_route_edited_to_an_invalid_layout_keeps_serving_until_it_is_fixed(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    """As a Deployment keeps its old pods when an update cannot roll out: an edit the
    operator (not CEL) finds invalid deletes nothing and says why; fixed, it rolls out."""
    await ready_route(cluster, make_route, make_artifact, rollout={"drainSeconds": 0})
    serving = {name: pod["metadata"]["uid"] for name, pod in pods(cluster).items()}
    addresses = [s["endpoint"] for s in route(cluster)["status"]["stages"]]
    short = make_route(ranges=[(0, 10), (10, 20), (20, 29)])["spec"]["stages"]
    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"stages": short}})
    await eventually(lambda: condition(route(cluster), "Degraded").get("reason") == "InvalidSpec",
                     what="the InvalidSpec condition")
    await eventually(lambda: "InvalidSpec" in event_reasons(cluster), what="an InvalidSpec event")
    body = route(cluster)
    assert "layer 29 would never run" in condition(body, "Degraded")["message"]
    assert "the pods of epoch 1 keep serving" in condition(body, "Degraded")["message"]
    assert {name: pod["metadata"]["uid"] for name, pod in pods(cluster).items()} == serving
    assert [s["endpoint"] for s in body["status"]["stages"]] == addresses
    assert body["status"]["stagesReady"] == "3/3" and body["status"]["epoch"] == 1
    assert gateway(cluster)["spec"]["replicas"] >= 1  # the stable addresses stay
    assert sorted(s["metadata"]["name"] for s in cluster.live("v1/services", NS)) == [
        "r1-gateway", "r1-workers"]

    fixed = make_route(ranges=[(0, 15), (15, 30)])["spec"]["stages"]
    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"stages": fixed}})
    await eventually(lambda: {"r1-s0-e2", "r1-s1-e2"} <= set(pods(cluster)),
                     what="the pods of epoch 2 beside epoch 1's")
    await mark_pods(cluster, NS)
    await eventually(lambda: sorted(pods(cluster)) == ["r1-s0-e2", "r1-s1-e2"],
                     what="epoch 1 gone once epoch 2 is ready")
    await eventually(lambda: condition(route(cluster), "Ready").get("status") == "True",
                     what="epoch 2 to be Ready")
    assert route(cluster)["status"]["epoch"] == 2
    assert condition(route(cluster), "Degraded")["reason"] == "AsExpected"


async def test_a_route_waits_for_its_artifact_and_starts_once_it_is_ready(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    artifact = make_artifact()
    await create(cluster, ARTIFACTS, artifact)
    await create(cluster, ROUTES, make_route())
    await eventually(lambda: condition(route(cluster), "Progressing").get("reason")
                     == "ArtifactNotReady")
    assert pods(cluster) == {}
    await cluster.patch(f"{ARTIFACTS}/smollm2/status", json={"status": artifact["status"]})
    await eventually(lambda: len(pods(cluster)) == 3, what="pods once the artifact is Ready")


async def test_a_crash_looping_stage_makes_the_route_degraded_naming_it(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    await ready_route(cluster, make_route, make_artifact)
    await mark_pods(cluster, NS, ready=False, waiting="CrashLoopBackOff",
                    select=lambda p: p["metadata"]["name"] == "r1-s2-e1")
    await eventually(lambda: condition(route(cluster), "Degraded").get("status") == "True")
    degraded = condition(route(cluster), "Degraded")
    assert degraded["reason"] == "StageCrashLooping"
    assert "stage s2 (pod r1-s2-e1) is CrashLoopBackOff" in degraded["message"]
    assert condition(route(cluster), "Ready")["status"] == "False"


Kubectl = Callable[..., Awaitable[str]]


def kubectl_for(cluster: Emulator, tmp_path: Path) -> Kubectl:
    """The real kubectl binary against the emulator: `await run(*args)` -> its stdout."""
    kubectl = install()["kubectl"]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": str(cluster.url).rstrip("/")}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [{"name": "emulator",
                      "context": {"cluster": "emulator", "user": "emulator", "namespace": NS}}],
    }))

    async def run(*args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            str(kubectl), "--kubeconfig", str(kubeconfig), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        return out.decode()

    return run


async def test_kubectl_applies_the_cluster_examples_and_the_operator_serves_them(
        cluster: Emulator, metrics: OperatorMetrics, tmp_path: Path) -> None:
    run = kubectl_for(cluster, tmp_path)
    examples = repo_root() / "examples"
    await run("apply", "--validate=false", "-f", str(examples / "modelartifact-smollm2.yaml"),
              "-f", str(examples / "shardroute-smollm2-3stage.yaml"))
    artifact = ModelArtifactSpec.model_validate(
        yaml.safe_load((examples / "modelartifact-smollm2.yaml").read_text())["spec"])
    await cluster.patch(f"{ARTIFACTS}/smollm2-135m-q4-1/status", json={"status": {
        "manifestDigest": artifact.manifest_digest(),
        "conditions": [{"type": "Ready", "status": "True", "reason": "Verified"}]}})
    await eventually(lambda: len(pods(cluster)) == 3, what="the example's three stage pods")
    await mark_pods(cluster, NS)
    await eventually(lambda: condition(route(cluster, "smollm2-3stage"), "Ready").get("status")
                     == "True", what="the example route to be Ready")
    assert await run("get", "shardroutes", "-o", "name") == \
        "shardroute.meshnet.dev/smollm2-3stage\n"
    assert await run("get", "sr", "smollm2-3stage", "-o",
                     "jsonpath={.status.epoch} {.status.stagesReady}") == "1 3/3"


async def test_meshnet_operator_run_serves_routes_health_and_metrics_from_its_own_process(
        cluster: Emulator, make_route: MakeRoute, make_artifact: MakeArtifact,
        tmp_path: Path) -> None:
    env = {"MESHNET_WORKER_IMAGE_CPU": "meshnet/worker-cpu:test", "MESHNET_PIN_DIGEST": "p" * 64}
    async with operator_process(cluster, env, tmp_path) as metrics_url:
        artifact = make_artifact()
        await create(cluster, ARTIFACTS, artifact)
        await cluster.patch(f"{ARTIFACTS}/smollm2/status", json={"status": artifact["status"]})
        await create(cluster, ROUTES, make_route())
        await eventually(lambda: len(pods(cluster)) == 3, what="pods from the operator process")
        # The pods exist before that reconcile has finished counting: poll the metrics.
        text = ""
        deadline = asyncio.get_running_loop().time() + 20
        async with httpx.AsyncClient() as client:
            while "meshnet_epoch_advances_total 1.0" not in text:
                assert asyncio.get_running_loop().time() < deadline, text
                await asyncio.sleep(0.1)
                text = (await client.get(metrics_url)).text
    assert 'meshnet_reconciles_total{kind="ShardRoute"}' in text
    assert "meshnet_epoch_advances_total 1.0" in text


def service_names(cluster: Emulator) -> list[str]:
    return sorted(s["metadata"]["name"] for s in cluster.live("v1/services", NS))


REPLICA_0 = ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
REPLICA_1 = ["r1-s0-e1-r1", "r1-s1-e1-r1", "r1-s2-e1-r1"]


async def test_scaling_a_route_adds_and_drains_whole_pipelines_at_the_same_epoch(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact) -> None:
    await ready_route(cluster, make_route, make_artifact, rollout={"drainSeconds": 2})
    serving = {name: pod["metadata"]["uid"] for name, pod in pods(cluster).items()}
    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"replicas": 2}})
    await eventually(lambda: sorted(pods(cluster)) == sorted(REPLICA_0 + REPLICA_1),
                     what="the second replica's pods")
    await eventually(lambda: service_names(cluster) == ["r1-gateway", "r1-workers",
                                                        "r1-workers-r1"],
                     what="the second replica's Service")
    assert {n: pods(cluster)[n]["metadata"]["uid"] for n in REPLICA_0} == serving
    head = pods(cluster)["r1-s0-e1-r1"]
    assert head["metadata"]["labels"]["meshnet.dev/epoch"] == "1"
    assert head["spec"]["subdomain"] == "r1-workers-r1"
    await mark_pods(cluster, NS)
    await eventually(lambda: route(cluster)["status"].get("readyReplicas") == 2,
                     what="both replicas ready")
    status = route(cluster)["status"]
    assert status["epoch"] == 1 and status["replicas"] == 2 and status["stagesReady"] == "6/6"
    assert [r["stagesReady"] for r in status["replicaStatuses"]] == ["3/3", "3/3"]

    await cluster.patch(f"{ROUTES}/r1", json={"spec": {"replicas": 1}})
    await eventually(lambda: route(cluster)["status"].get("draining") == ["e1/r1"],
                     what="replica 1 draining")
    # it takes no new sessions (the gateway no longer names it) and its sessions go on
    assert [[p["metadata"]["name"] for p in group] for group in gateway_pods(cluster)] \
        == [REPLICA_0]
    assert sorted(pods(cluster)) == sorted(REPLICA_0 + REPLICA_1)
    assert "r1-workers-r1" in service_names(cluster)  # its stages keep their names
    await eventually(lambda: sorted(pods(cluster)) == REPLICA_0
                     and service_names(cluster) == ["r1-gateway", "r1-workers"],
                     what="replica 1's pods and Service gone after its drain")
    await eventually(lambda: route(cluster)["status"].get("replicas") == 1,
                     what="the status of one replica")
    status = route(cluster)["status"]
    assert status["epoch"] == 1 and status["readyReplicas"] == 1
    assert condition(route(cluster), "Ready")["status"] == "True"
    assert {n: pods(cluster)[n]["metadata"]["uid"] for n in REPLICA_0} == serving
    await eventually(lambda: "ReplicaRemoved" in event_reasons(cluster),
                     what="the ReplicaRemoved event")
    assert event_reasons(cluster).count("EpochAdvanced") == 1


async def test_kubectl_scale_goes_through_the_scale_subresource_down_to_zero_and_back(
        cluster: Emulator, metrics: OperatorMetrics, make_route: MakeRoute,
        make_artifact: MakeArtifact, tmp_path: Path) -> None:
    run = kubectl_for(cluster, tmp_path)
    await ready_route(cluster, make_route, make_artifact, rollout={"drainSeconds": 0})
    scale_path = f"{ROUTES}/r1/scale"
    scale = json.loads(await run("get", "--raw", scale_path))
    assert (scale["kind"], scale["spec"], scale["status"]) == (
        "Scale", {"replicas": 1}, {"replicas": 1, "selector": "meshnet.dev/route=r1"})

    assert "scaled" in await run("scale", "sr", "r1", "--replicas", "2")
    assert cluster.calls["patch shardroutes/scale"] == 1  # the subresource, not the route
    await eventually(lambda: sorted(pods(cluster)) == sorted(REPLICA_0 + REPLICA_1),
                     what="kubectl scale's second replica")
    await mark_pods(cluster, NS)
    await eventually(lambda: route(cluster)["status"].get("readyReplicas") == 2,
                     what="two ready replicas")
    assert await run("get", "sr", "r1", "-o",
                     "jsonpath={.spec.replicas} {.status.readyReplicas} {.status.epoch}") \
        == "2 2 1"
    scale = json.loads(await run("get", "--raw", scale_path))
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2

    await run("scale", "sr", "r1", "--replicas", "0")
    await eventually(lambda: not pods(cluster) and service_names(cluster) == ["r1-gateway"],
                     what="no stage pods at zero replicas")
    await eventually(lambda: condition(route(cluster), "Ready").get("reason") == "ScaledToZero",
                     what="Ready False: ScaledToZero")
    assert condition(route(cluster), "Degraded")["status"] == "False"
    assert route(cluster)["status"]["epoch"] == 1

    await run("scale", "sr", "r1", "--replicas", "1")
    await eventually(lambda: sorted(pods(cluster)) == REPLICA_0, what="replica 0 back")
    await mark_pods(cluster, NS)
    await eventually(lambda: condition(route(cluster), "Ready").get("status") == "True",
                     what="the route Ready again")
    assert route(cluster)["status"]["epoch"] == 1
    assert event_reasons(cluster).count("EpochAdvanced") == 1
