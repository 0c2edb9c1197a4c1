"""spec.placement Measured end to end: the real operator against kmock's emulator; its
measuring Job's command is run for real (`meshnet links place`) against real probe agents
on loopback, one leg of the ring slowed by a link proxy; the Job's pod hands the links back
as its termination message, and the stages are reassigned as a new epoch. A Static route
beside it is never measured or moved."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshnet.devtools.cluster import Emulator, emulated_cluster, eventually, running_operator
from meshnet.devtools.link_model import Link
from meshnet.devtools.link_proxy import LinkProxy
from meshnet.devtools.provisioning import declare_provisioning
from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator.settings import OperatorSettings

MakeArtifact = MakeRoute = Callable[..., dict[str, Any]]  # fixtures from conftest.py
MESHNET = Path(sys.executable).parent / "meshnet"
NS = "default"
ROUTES = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/shardroutes"
ARTIFACTS = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/modelartifacts"
PODS = f"/api/v1/namespaces/{NS}/pods"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
SETTINGS = OperatorSettings(worker_images={"cpu": "meshnet/worker-cpu:test"},
                            pin_digest="p" * 64, metrics_port=0, health_port=0,
                            gateway_image="meshnet/operator:test")
NODES = {"s0": "node-a", "s1": "node-b", "s2": "node-c"}  # where the scheduler put them
PLACEMENT_ROUTE = "meshnet.dev/placement-route"
WATCHED = {"shardroutes", "jobs", "pods"}


@pytest.fixture
async def cluster() -> AsyncIterator[Emulator]:
    async with emulated_cluster() as emulator:
        declare_provisioning(emulator)  # Jobs, beside what every test has
        yield emulator


@pytest.fixture
async def operator(cluster: Emulator) -> AsyncIterator[None]:
    async with running_operator(cluster, SETTINGS, OperatorMetrics()):
        await eventually(lambda: cluster.watched >= WATCHED, what="the operator's watches")
        await asyncio.sleep(0.5)
        yield


def live(cluster: Emulator, resource: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in cluster.live(resource, NS)}


def route(cluster: Emulator, name: str) -> dict[str, Any]:
    return live(cluster, "meshnet.dev/v1alpha1/shardroutes").get(name, {})


def stage_pods(cluster: Emulator, name: str) -> dict[str, dict[str, Any]]:
    return {n: p for n, p in live(cluster, "v1/pods").items()
            if p["metadata"]["labels"].get("meshnet.dev/route") == name}


def probes(cluster: Emulator, resource: str, name: str) -> dict[str, dict[str, Any]]:
    """The route's probe agents (v1/pods, without the Job's pod) or measuring Jobs."""
    return {n: o for n, o in live(cluster, resource).items()
            if o["metadata"]["labels"].get(PLACEMENT_ROUTE) == name
            and "job-name" not in o["metadata"]["labels"]}


async def create(cluster: Emulator, url: str, body: dict[str, Any]) -> None:
    body = {k: v for k, v in body.items() if k != "status"} | {"metadata": {
        k: v for k, v in body["metadata"].items() if k not in ("uid", "generation")}}
    response = await cluster.post(url, json=body)
    assert response.status == 200, await response.text()


async def schedule(cluster: Emulator, name: str) -> None:
    """The scheduler and kubelet: a pinned stage pod runs on its node, any other where
    NODES puts its stage; Running and Ready."""
    for pod_name, pod in stage_pods(cluster, name).items():
        if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
            continue
        stage = pod["metadata"]["labels"]["meshnet.dev/stage"]
        terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
        node = terms[0]["matchFields"][0]["values"][0] if terms else NODES[stage]
        await cluster.patch(f"{PODS}/{pod_name}", json={"spec": {"nodeName": node}})
        await cluster.patch(f"{PODS}/{pod_name}/status", json={"status": {
            "phase": "Running", "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "worker", "restartCount": 0, "ready": True,
                                   "state": {}}]}})


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[[str], dict[str, str]]]:
    """Real probe agents (`meshnet links serve`) on loopback, one per node, holding the
    route's token: node -> address."""
    started: list[subprocess.Popen[str]] = []

    def start(token: str) -> dict[str, str]:
        (tmp_path / "token").write_text(token)
        addresses = {}
        for node in NODES.values():
            process = subprocess.Popen([str(MESHNET), "links", "serve", "--listen",
                                        "127.0.0.1:0", "--token-file", str(tmp_path / "token")],
                                       stdout=subprocess.PIPE, text=True)
            started.append(process)
            assert process.stdout is not None
            addresses[node] = process.stdout.readline().split()[-1]
        return addresses

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def run_job(job: dict[str, Any], agents: dict[str, str], pod_ips: dict[str, str],
            tmp_path: Path, slow: LinkProxy) -> str:
    """The Job's container command, run here: each agent's pod address is its loopback
    one, the b -> c leg goes through the slow proxy, the token and termination log are
    files here. Returns the termination message."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    to_loopback = {f"{ip}:{SETTINGS.placement_port}": agents[node]
                   for node, ip in pod_ips.items()}
    args = []
    for arg in container["args"]:
        node, sep, address = arg.partition("=")
        args.append(f"{node}={to_loopback[address]}" if sep and address in to_loopback
                    else arg)
    files = {"/etc/meshnet/probe/token": str(tmp_path / "token"),
             container["terminationMessagePath"]: str(tmp_path / "termination-log")}
    args = [files.get(a, a) for a in args]
    args[args.index("--probe-bytes") + 1] = "1M"  # (quick: the delay is what is planted)
    done = subprocess.run([str(MESHNET), *args, f"--via=node-b,node-c={slow.endpoint}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return (tmp_path / "termination-log").read_text()


async def measure(cluster: Emulator, name: str, agents: Callable[[str], dict[str, str]],
                  tmp_path: Path, b_to_c: Link) -> None:
    """The route's probe agents run for real on loopback, and its measuring Job's command
    with the b -> c leg through a link proxy shaped as `b_to_c`; the Job ends with that."""
    # an agent on every node of the measured route, holding its token
    await eventually(lambda: len(probes(cluster, "v1/pods", name)) == 3,
                     what="three probe agents")
    agent_pods = probes(cluster, "v1/pods", name)
    assert sorted(p["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchFields"][0]["values"][0] for p in agent_pods.values()) == sorted(NODES.values())
    (secret,) = [s for s in live(cluster, "v1/secrets").values()
                 if s["metadata"]["labels"].get(PLACEMENT_ROUTE) == name]
    addresses = agents(secret["stringData"]["token"])
    pod_ips = {}
    for i, (pod_name, pod) in enumerate(sorted(agent_pods.items())):
        node = pod["metadata"]["annotations"]["meshnet.dev/placement-node"]
        pod_ips[node] = f"10.9.0.{i + 1}"
        await cluster.patch(f"{PODS}/{pod_name}/status", json={"status": {
            "phase": "Running", "podIP": pod_ips[node],
            "conditions": [{"type": "Ready", "status": "True"}]}})

    await eventually(lambda: len(probes(cluster, "batch/v1/jobs", name)) == 1,
                     what="the measuring Job")
    ((job_name, job),) = probes(cluster, "batch/v1/jobs", name).items()
    slow = LinkProxy(int(addresses["node-c"].rpartition(":")[2]), b_to_c)
    try:
        message = await asyncio.to_thread(run_job, job, addresses, pod_ips, tmp_path, slow)
    finally:
        slow.stop()
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    await create(cluster, PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{job_name}-x1", "namespace": NS,
                     "labels": {**job_labels, "job-name": job_name}},
        "spec": job["spec"]["template"]["spec"]})
    await cluster.patch(f"{PODS}/{job_name}-x1/status", json={"status": {
        "phase": "Succeeded", "containerStatuses": [{"name": "measure", "state": {
            "terminated": {"exitCode": 0, "message": message}}}]}})
    await cluster.patch(f"{JOBS}/{job_name}/status", json={"status": {
        "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})


async def ready_artifact(cluster: Emulator, make_artifact: MakeArtifact) -> None:
    """The routes' artifact, created and verified."""
    artifact = make_artifact()
    await create(cluster, ARTIFACTS, artifact)
    await cluster.patch(f"{ARTIFACTS}/smollm2/status", json={"status": artifact["status"]})


async def test_a_measured_route_is_reassigned_around_a_slow_leg_as_a_new_epoch(
        cluster: Emulator, operator: None, make_route: MakeRoute, make_artifact: MakeArtifact,
        agents: Callable[[str], dict[str, str]], tmp_path: Path) -> None:
    await ready_artifact(cluster, make_artifact)
    ring = {"lane": "cpu", "topology": "ring"}
    await create(cluster, ROUTES, make_route("measured", recipe=ring, placement="Measured",
                                             rollout={"drainSeconds": 0}))
    await create(cluster, ROUTES, make_route("static", recipe=ring))
    for name in ("measured", "static"):
        await eventually(lambda n=name: len(stage_pods(cluster, n)) == 3, what="stage pods")
        await schedule(cluster, name)

    # the measuring Job, run for real with the b -> c leg 50 ms round trip
    await measure(cluster, "measured", agents, tmp_path, Link(delay_s=0.025))

    await eventually(lambda: (route(cluster, "measured")["status"].get("placement") or {})
                     .get("reason") == "Reassigned", what="the stages reassigned")
    print(route(cluster, "measured")["status"].get("placement"))
    placement = route(cluster, "measured")["status"]["placement"]
    links = {(x["fromNode"], x["toNode"]): x for x in placement["links"]}
    assert len(links) == 6
    assert links["node-b", "node-c"]["rttSeconds"] >= 0.050
    assert max(x["rttSeconds"] for pair, x in links.items() if pair != ("node-b", "node-c")) \
        < 0.025
    assert placement["currentOrder"] == ["node-a", "node-b", "node-c"]
    best = placement["bestOrder"]
    assert ("node-b", "node-c") not in {*zip(best, [*best[1:], best[0]], strict=True)}, best
    assert placement["currentSeconds"] - placement["bestSeconds"] > 0.020
    assert placement["gateway"] == best[0]
    assert placement["assignment"] == dict(zip(NODES, best, strict=True))
    assert route(cluster, "measured")["status"]["epoch"] == 2

    # epoch 2's pods are pinned to the best order; once they run, epoch 1's go
    await eventually(lambda: any("-e2" in n for n in stage_pods(cluster, "measured")),
                     what="epoch 2's pods")
    for _ in range(100):
        await schedule(cluster, "measured")
        if all("-e2" in n for n in stage_pods(cluster, "measured")):
            break
        await asyncio.sleep(0.1)
    on_nodes = {p["metadata"]["labels"]["meshnet.dev/stage"]: p["spec"]["nodeName"]
                for p in stage_pods(cluster, "measured").values()}
    assert on_nodes == placement["assignment"]
    await eventually(lambda: route(cluster, "measured")["status"]["placement"]["reason"]
                     == "Measured", what="the new order measured as the best")
    settled = route(cluster, "measured")["status"]["placement"]
    assert settled["currentOrder"] == best and settled["assignment"] == placement["assignment"]
    assert route(cluster, "measured")["status"]["epoch"] == 2  # no flapping
    await eventually(lambda: not probes(cluster, "v1/pods", "measured")
                     and not probes(cluster, "batch/v1/jobs", "measured"),
                     what="agents and Job gone once read")

    # the Static route beside it: never measured, never moved
    static = route(cluster, "static")["status"]
    assert "placement" not in static and static["epoch"] == 1
    assert not probes(cluster, "v1/pods", "static")
    assert sorted(stage_pods(cluster, "static")) == ["static-s0-e1", "static-s1-e1",
                                                     "static-s2-e1"]


def packing(cluster: Emulator, name: str) -> dict[str, bool]:
    """Stage -> whether its live pod's worker packs what it relays."""
    return {p["metadata"]["labels"]["meshnet.dev/stage"]: "shuffle-lz4" in p["spec"][
        "containers"][0]["args"] for p in stage_pods(cluster, name).values()
        if not p["metadata"].get("deletionTimestamp")}


async def test_a_leg_measured_below_the_break_even_has_its_sending_stage_pack(
        cluster: Emulator, operator: None, make_route: MakeRoute, make_artifact: MakeArtifact,
        agents: Callable[[str], dict[str, str]], tmp_path: Path) -> None:
    await ready_artifact(cluster, make_artifact)
    body = make_route("pinned", recipe={"lane": "cpu", "topology": "ring"},
                      placement="Measured", rollout={"drainSeconds": 0})
    for stage in body["spec"]["stages"]:  # the user keeps every stage where it is
        stage["nodeSelector"] = {"pool": "pinned"}
    await create(cluster, ROUTES, body)
    await eventually(lambda: len(stage_pods(cluster, "pinned")) == 3, what="stage pods")
    await schedule(cluster, "pinned")
    assert packing(cluster, "pinned") == {"s0": False, "s1": False, "s2": False}
    uids = {n: p["metadata"]["uid"] for n, p in stage_pods(cluster, "pinned").items()}

    # b -> c (s1 -> s2) through a 100 Mbit/s proxy; the loopback legs are far faster
    await measure(cluster, "pinned", agents, tmp_path, Link(bandwidth_bps=100e6))
    await eventually(lambda: route(cluster, "pinned")["status"].get("compressedLegs")
                     == ["s1->s2"], what="the slow leg packed")
    placement = route(cluster, "pinned")["status"]["placement"]
    links = {(x["fromNode"], x["toNode"]): x["bytesPerSecond"] * 8 for x in placement["links"]}
    slow = links.pop(("node-b", "node-c"))
    assert slow < 416e6 < min(links.values()), (slow, links)

    # s1's pod is replaced in place (same name and epoch) with the flag; s0 and s2 keep theirs
    await eventually(lambda: packing(cluster, "pinned").get("s1") is True,
                     what="s1 restarted packing")
    await schedule(cluster, "pinned")
    assert packing(cluster, "pinned") == {"s0": False, "s1": True, "s2": False}
    now = {n: p["metadata"]["uid"] for n, p in stage_pods(cluster, "pinned").items()}
    assert sorted(now) == ["pinned-s0-e1", "pinned-s1-e1", "pinned-s2-e1"]
    assert {n for n in now if now[n] == uids[n]} == {"pinned-s0-e1", "pinned-s2-e1"}
    assert route(cluster, "pinned")["status"]["epoch"] == 1
    await eventually(lambda: route(cluster, "pinned")["status"]["placement"]["reason"]
                     == "AllStagesPinned", what="the same nodes, nothing reassigned")
    assert route(cluster, "pinned")["status"]["compressedLegs"] == ["s1->s2"]
