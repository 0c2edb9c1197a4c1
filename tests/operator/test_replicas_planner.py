"""The pure planner with spec.replicas: a fleet of identical pipelines of one epoch, each
with its own pods, Service and links; scaling is placement, never a new identity."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from meshnet.reconcile.plan import Create, Delete, Patch, Plan, steps
from meshnet.reconcile.route import (
    Observed,
    WorkerConfig,
    observe_pod,
    observe_referenced_artifact,
    observe_route,
    plan,
)

from .test_planner import CONFIG, NOW, kubelet

GATEWAYED = dataclasses.replace(CONFIG, gateway_image="meshnet/operator:1")
MakeArtifact = MakeRoute = Callable[..., dict[str, Any]]  # fixtures from conftest.py
IDENTITY = ("epoch", "routeDigest", "recipeDigest", "manifestDigest")


class Fleet:
    """A route, its artifact, and its pods and Services as the cluster would keep them."""

    def __init__(self, route: dict[str, Any], artifact: dict[str, Any],
                 config: WorkerConfig = GATEWAYED) -> None:
        self.route, self.artifact, self.config = route, artifact, config
        self.pods: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.gateway: dict[str, str] = {}  # kind -> template hash of the gateway's children
        self.now = NOW
        self.gateway_args: list[list[str]] = []  # the replicas the gateway is given
        self.gateway_rolled_out = False  # the Deployment controller's word
        self.idle: frozenset[tuple[int, int]] = frozenset()  # what the stages answered

    def observe(self) -> Observed:
        pods = tuple(p for p in map(observe_pod, self.pods.values()) if p is not None)
        services = {int(s["metadata"]["labels"]["meshnet.dev/replica"]):
                    s["metadata"]["labels"]["meshnet.dev/template-hash"]
                    for s in self.services.values()}
        return Observed(observe_route(self.route), pods, services=services,
                        artifact=observe_referenced_artifact(self.artifact),
                        gateway_deployment_hash=self.gateway.get("Deployment"),
                        gateway_service_hash=self.gateway.get("Service"),
                        gateway_rolled_out=self.gateway_rolled_out, idle_pipelines=self.idle)

    def step(self) -> Plan:
        result = plan(self.observe(), self.config, self.now)
        kubelet(self.pods, result)
        for action in result.actions:
            if isinstance(action, Create | Patch) and _is_gateway(action):
                body = action.obj if isinstance(action, Create) else action.body
                kind = action.obj["kind"] if isinstance(action, Create) else action.kind
                self.gateway[kind] = body["metadata"]["labels"]["meshnet.dev/template-hash"]
                if kind == "Deployment":
                    self.gateway_args = gateway_replicas(Plan(steps((action,))))
            elif isinstance(action, Create) and action.obj["kind"] == "Service":
                self.services[action.obj["metadata"]["name"]] = action.obj
            elif isinstance(action, Delete) and action.kind == "Service":
                self.services.pop(action.name)
        if result.status is not None:
            self.route["status"] = result.status
        return result

    def converge(self) -> list[Plan]:
        plans = []
        for _ in range(10):
            plans.append(self.step())
            if not plans[-1].actions and plans[-1].status is None:
                return plans
        raise AssertionError("the planner did not converge")

    def scale(self, replicas: int) -> list[Plan]:
        self.route["spec"]["replicas"] = replicas
        self.route["metadata"]["generation"] += 1
        return self.converge()

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.route["status"]["conditions"] if c["type"] == kind)


def _is_gateway(action: Create | Patch) -> bool:
    name = action.obj["metadata"]["name"] if isinstance(action, Create) else action.name
    return name.endswith("-gateway")


def gateway_replicas(result: Plan) -> list[list[str]]:
    """The stage hosts (no namespace, no port) of each replica the plan gives the gateway."""
    body = next(a.obj if isinstance(a, Create) else a.body for a in result.actions
                if (isinstance(a, Create) and a.obj["kind"] == "Deployment")
                or (isinstance(a, Patch) and a.kind == "Deployment"))
    values = body["spec"]["template"]["spec"]["containers"][0]["args"]
    pairs = list(itertools.pairwise(values))
    groups = [[v for k, v in pairs if k == "--stage"]] if "--stage" in values else [
        v.split(",") for k, v in pairs if k == "--replica"]
    return [[".".join(a.split(".")[:2]) for a in group] for group in groups]


def reasons(plans: list[Plan]) -> list[str]:
    return [e.reason for p in plans for e in p.events]


def args(pod: dict[str, Any]) -> dict[str, str]:
    values = pod["spec"]["containers"][0]["args"]
    return dict(zip(values[::2], values[1::2], strict=True))


def test_scaling_never_changes_the_epoch_or_the_digests_nor_touches_running_replicas(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(rollout={"drainSeconds": 0}), make_artifact())
    fleet.converge()
    identity = {k: fleet.route["status"][k] for k in IDENTITY}
    uids = {n: p["metadata"]["uid"] for n, p in fleet.pods.items()}
    for replicas in (3, 0, 2, 1):
        plans = fleet.scale(replicas)
        assert {k: fleet.route["status"][k] for k in IDENTITY} == identity, replicas
        assert "EpochAdvanced" not in reasons(plans) and "StagePodReplaced" not in reasons(plans)
        assert len(fleet.pods) == 3 * replicas
        assert {p["metadata"]["labels"]["meshnet.dev/epoch"] for p in fleet.pods.values()} \
            <= {"1"}
        # the pods that stay are the same pods: scaling restarts nothing that runs
        assert all(fleet.pods[n]["metadata"]["uid"] == uid for n, uid in uids.items()
                   if n in fleet.pods)
        uids |= {n: p["metadata"]["uid"] for n, p in fleet.pods.items()}


def test_each_replica_is_a_pipeline_with_its_own_pods_service_and_ring_links(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=2, recipe={"lane": "cpu", "topology": "ring"}),
                  make_artifact())
    fleet.converge()
    assert sorted(fleet.pods) == ["r1-s0-e1", "r1-s0-e1-r1", "r1-s1-e1", "r1-s1-e1-r1",
                                  "r1-s2-e1", "r1-s2-e1-r1"]
    assert sorted(fleet.services) == ["r1-workers", "r1-workers-r1"]
    for replica, service in ((0, "r1-workers"), (1, "r1-workers-r1")):
        selector = fleet.services[service]["spec"]["selector"]
        assert selector == {"meshnet.dev/route": "r1", "meshnet.dev/replica": str(replica)}
    head = fleet.pods["r1-s0-e1-r1"]
    assert head["spec"]["hostname"] == "s0-e1" and head["spec"]["subdomain"] == "r1-workers-r1"
    assert head["metadata"]["labels"]["meshnet.dev/replica"] == "1"
    assert {k: v for k, v in args(head).items() if k in ("--next-stage", "--ring-last")} == {
        "--next-stage": "s1-e1.r1-workers-r1.default.svc:50051",
        "--ring-last": "s2-e1.r1-workers-r1.default.svc:50051"}
    assert args(fleet.pods["r1-s0-e1"])["--next-stage"] == "s1-e1.r1-workers.default.svc:50051"
    # same epoch, same identities: the replicas differ only in where their links point
    assert args(head)["--route-digest"] == args(fleet.pods["r1-s0-e1"])["--route-digest"]
    status = fleet.route["status"]
    assert status["replicas"] == 2 and status["readyReplicas"] == 2
    assert status["selector"] == "meshnet.dev/route=r1"
    assert status["stagesReady"] == "6/6"
    assert status["capacity"] == {"readyStages": 6, "totalStages": 6, "sessionSlots": 8}
    assert [(r["replica"], r["ready"], r["stagesReady"]) for r in status["replicaStatuses"]] \
        == [(0, True, "3/3"), (1, True, "3/3")]
    assert status["replicaStatuses"][1]["stages"][2]["endpoint"] == \
        "s2-e1.r1-workers-r1.default.svc:50051"
    assert status["stages"] == status["replicaStatuses"][0]["stages"]
    assert fleet.condition("Ready")["message"] == "2/2 replicas ready at epoch 1"


def test_pods_of_one_stage_prefer_different_nodes_unless_the_stage_says_otherwise(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route = make_route(replicas=2)
    gpu_nodes = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}}
    route["spec"]["stages"][1]["affinity"] = gpu_nodes
    route["spec"]["stages"][2]["affinity"] = {"podAntiAffinity": {}}  # the user's own: none
    fleet = Fleet(route, make_artifact())
    fleet.converge()
    spread = {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"meshnet.dev/route": "r1",
                                              "meshnet.dev/stage": "s0"}},
            "topologyKey": "kubernetes.io/hostname"}}]}
    for name in ("r1-s0-e1", "r1-s0-e1-r1"):
        assert fleet.pods[name]["spec"]["affinity"] == {"podAntiAffinity": spread}
    s1 = fleet.pods["r1-s1-e1-r1"]["spec"]["affinity"]
    assert s1["nodeAffinity"] == gpu_nodes["nodeAffinity"]
    assert s1["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "podAffinityTerm"]["labelSelector"]["matchLabels"]["meshnet.dev/stage"] == "s1"
    assert fleet.pods["r1-s2-e1-r1"]["spec"]["affinity"] == {"podAntiAffinity": {}}


def test_scaling_down_drains_the_replicas_past_spec_replicas_then_deletes_them_and_services(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=3), make_artifact())
    fleet.converge()
    first = fleet.scale(1)[0]
    assert not any(isinstance(a, Delete) for a in first.actions)
    assert sorted(a.name for a in first.actions if isinstance(a, Patch) and a.kind == "Pod") == [
        "r1-s0-e1-r1", "r1-s0-e1-r2", "r1-s1-e1-r1", "r1-s1-e1-r2", "r1-s2-e1-r1",
        "r1-s2-e1-r2"]
    assert [e.reason for e in first.events] == ["PipelineDraining", "PipelineDraining"]
    assert "replica 1 is past spec.replicas 1" in first.events[0].message
    status = fleet.route["status"]
    assert status["draining"] == ["e1/r1", "e1/r2"]
    assert gateway_replicas(first) == [["s0-e1.r1-workers", "s1-e1.r1-workers",
                                        "s2-e1.r1-workers"]]  # the drained ones take no more
    fleet.now += timedelta(seconds=59)
    assert not any(isinstance(a, Delete) for a in fleet.step().actions)
    fleet.now += timedelta(seconds=1)
    last = fleet.converge()
    assert sorted(a.name for p in last for a in p.actions if isinstance(a, Delete)) == [
        "r1-s0-e1-r1", "r1-s0-e1-r2", "r1-s1-e1-r1", "r1-s1-e1-r2", "r1-s2-e1-r1",
        "r1-s2-e1-r2", "r1-workers-r1", "r1-workers-r2"]
    assert "ReplicaRemoved" in reasons(last) and "draining" not in fleet.route["status"]
    assert sorted(fleet.pods) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
    assert sorted(fleet.services) == ["r1-workers"]
    status = fleet.route["status"]
    assert status["replicas"] == 1 and status["readyReplicas"] == 1
    assert len(status["replicaStatuses"]) == 1 and status["stagesReady"] == "3/3"


def test_a_draining_replica_goes_once_its_sessions_end_and_no_gateway_can_send_it_more(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=2), make_artifact())
    fleet.converge()
    fleet.scale(1)
    assert fleet.route["status"]["draining"] == ["e1/r1"]
    assert fleet.step().requeue_after == 2.0  # back soon to ask its stages, not in 60 s
    fleet.idle = frozenset({(1, 1)})
    # the gateway's old pod may still admit sessions to it until the Deployment has rolled
    assert not any(isinstance(a, Delete) for a in fleet.step().actions)
    fleet.gateway_rolled_out = True
    gone = fleet.step()
    assert sorted(a.name for a in gone.actions if isinstance(a, Delete)) == [
        "r1-s0-e1-r1", "r1-s1-e1-r1", "r1-s2-e1-r1"]
    assert any("its sessions ended" in e.message for e in gone.events)
    fleet.idle = frozenset()
    fleet.converge()
    assert sorted(fleet.pods) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
    assert "draining" not in fleet.route["status"]


def test_a_draining_replica_whose_stages_hold_sessions_waits_for_its_drain_to_end(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=2), make_artifact())
    fleet.converge()
    fleet.scale(1)
    fleet.gateway_rolled_out = True  # and fleet.idle stays empty: a stage holds a session
    fleet.now += timedelta(seconds=59)
    assert not any(isinstance(a, Delete) for a in fleet.step().actions)
    fleet.now += timedelta(seconds=1)
    assert any("drain ended" in e.message for e in fleet.step().events)


def test_a_route_at_zero_replicas_runs_nothing_and_is_not_ready_without_being_degraded(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=0), make_artifact())
    fleet.converge()
    assert fleet.pods == {} and fleet.services == {}
    status = fleet.route["status"]
    assert status["epoch"] == 1 and status["routeDigest"]  # the identity exists all the same
    assert status["replicas"] == 0 and status["readyReplicas"] == 0
    assert status["replicaStatuses"] == [] and status["stagesReady"] == "0/0"
    assert [s["name"] for s in status["stages"]] == ["s0", "s1", "s2"]  # the layout, no pods
    assert not any(s["ready"] or "pod" in s for s in status["stages"])
    assert status["capacity"]["sessionSlots"] == 0
    ready, progressing = fleet.condition("Ready"), fleet.condition("Progressing")
    assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero")
    assert (progressing["status"], progressing["reason"]) == ("False", "ScaledToZero")
    assert fleet.condition("Degraded")["status"] == "False"
    fleet.scale(1)
    assert sorted(fleet.pods) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
    assert fleet.condition("Ready")["status"] == "True" and fleet.route["status"]["epoch"] == 1


def test_a_fleet_serves_while_one_replica_is_ready_and_says_which_are_not(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=2), make_artifact())
    fleet.converge()
    fleet.pods["r1-s1-e1-r1"]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    fleet.step()
    ready = fleet.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("True", "SomeReplicasReady")
    assert ready["message"] == "1/2 replicas ready at epoch 1: waiting for s1 of replica 1"
    assert fleet.condition("Progressing")["reason"] == "StagesStarting"
    status = fleet.route["status"]
    assert status["readyReplicas"] == 1 and status["replicas"] == 2
    assert status["capacity"] == {"readyStages": 5, "totalStages": 6, "sessionSlots": 4}
    for pod in fleet.pods.values():
        pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    fleet.step()
    assert (fleet.condition("Ready")["status"], fleet.condition("Ready")["reason"]) == (
        "False", "StagesNotReady")


def test_an_invalid_edit_keeps_every_replica_serving_and_described(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=2), make_artifact())
    fleet.converge()
    fleet.route["spec"]["stages"][2]["layers"]["end"] = 29  # layer 29 would never run
    fleet.route["spec"]["replicas"] = 1
    result = fleet.step()
    assert result.actions == ()  # nothing deleted, not even the replica scaled away
    status = fleet.route["status"]
    assert fleet.condition("Ready")["reason"] == "InvalidSpec"
    assert [r["stagesReady"] for r in status["replicaStatuses"]] == ["3/3", "3/3"]
    assert status["replicas"] == status["readyReplicas"] == 2  # they serve, not advertised
    assert status["capacity"]["sessionSlots"] == 0


def pipelines_of(fleet: Fleet) -> dict[str, set[str]]:
    """Each running pipeline ("e<epoch>/r<replica>") and the epochs its links name."""
    found: dict[str, set[str]] = {}
    for pod in fleet.pods.values():
        tags = pod["metadata"]["labels"]
        key = f"e{tags['meshnet.dev/epoch']}/r{tags['meshnet.dev/replica']}"
        found.setdefault(key, set()).update(
            v.split(".")[0].rsplit("-", 1)[1] for k, v in args(pod).items()
            if k in ("--next-stage", "--ring-last"))
    return found


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_resplit_rolls_replica_by_replica_beside_the_old_epoch_and_always_serves(
        make_route: MakeRoute, make_artifact: MakeArtifact, replicas: int) -> None:
    fleet = Fleet(make_route(replicas=replicas, recipe={"lane": "cpu", "topology": "ring"}),
                  make_artifact())
    fleet.converge()
    fleet.route["spec"]["stages"][0]["layers"]["end"] = 12
    fleet.route["spec"]["stages"][1]["layers"]["begin"] = 12
    fleet.route["metadata"]["generation"] += 1
    seen, gateway, updated = [], [fleet.gateway_args], [0]
    for _ in range(40):
        result = fleet.step()
        status = fleet.route["status"]
        seen.append(sorted(pipelines_of(fleet)))
        # never down: a replica is ready, the gateway names only ready pipelines' stages
        assert status["readyReplicas"] >= 1 and fleet.condition("Ready")["status"] == "True"
        # what a user follows: the target epoch at once, Updated counting the replicas
        # that a ready pipeline of it serves, each replica's stages of one epoch
        assert status["epoch"] == 2
        assert status["updatedReplicas"] == sum(
            1 for r in status["replicaStatuses"] if r["ready"] and r.get("epoch") == 2)
        for replica in status["replicaStatuses"]:  # (a replica drained first shows none)
            shown = {s["epoch"] for s in replica["stages"] if "epoch" in s}
            assert shown == ({replica["epoch"]} if "epoch" in replica else set())
        if status["updatedReplicas"] != updated[-1]:
            updated.append(status["updatedReplicas"])
        assert len(pipelines_of(fleet)) <= replicas + 1  # maxSurge 1
        for name, linked in pipelines_of(fleet).items():  # never mixed inside a pipeline
            assert linked <= {name.split("/")[0]}, name
        if fleet.gateway_args != gateway[-1]:
            gateway.append(fleet.gateway_args)
        if not result.actions and result.status is None:
            if not status.get("draining"):
                break
            fleet.now += timedelta(seconds=60)  # the drain ends
    assert sorted(pipelines_of(fleet)) == [f"e2/r{r}" for r in range(replicas)]
    assert updated == list(range(replicas + 1))  # one replica at a time, never back
    assert fleet.condition("Progressing")["status"] == "False"
    # replica by replica: at most one replica had both epochs' pipelines at once
    assert all(sum(1 for r in range(replicas) if f"e1/r{r}" in s and f"e2/r{r}" in s) <= 1
               for s in seen)
    epochs = [[group[0].split(".")[0].rsplit("-", 1)[1] for group in groups]
              for groups in gateway]
    assert epochs[0] == ["e1"] * replicas and epochs[-1] == ["e2"] * replicas
    assert len(epochs) == replicas + 1  # the gateway switched one replica at a time


def test_without_surge_a_replica_is_drained_first_within_max_unavailable(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=2, rollout={"maxSurge": 0, "drainSeconds": 0}),
                  make_artifact())
    fleet.converge()
    fleet.route["spec"]["stages"][0]["layers"]["end"] = 12
    fleet.route["spec"]["stages"][1]["layers"]["begin"] = 12
    first = fleet.step()
    assert sorted(a.name for a in first.actions if isinstance(a, Delete)) == [
        "r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]  # replica 0 first; replica 1 serves meanwhile
    assert sorted(pipelines_of(fleet)) == ["e1/r1", "e2/r0"]
    fleet.converge()
    assert sorted(pipelines_of(fleet)) == ["e2/r0", "e2/r1"]


def test_an_in_place_change_replaces_one_replica_at_a_time_while_another_serves(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=2), make_artifact())
    fleet.converge()
    fleet.route["spec"]["recipe"]["image"] = "registry.local/worker:patched"  # same epoch
    fleet.route["metadata"]["generation"] += 1
    first = plan(fleet.observe(), fleet.config, fleet.now)
    assert sorted(a.name for a in first.actions if isinstance(a, Delete)) == [
        "r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]  # replica 0 only: replica 1 serves meanwhile
    for _ in range(10):
        result = fleet.step()
        assert fleet.route["status"]["readyReplicas"] >= 1
        if not result.actions and result.status is None:
            break
    assert all(p["spec"]["containers"][0]["image"] == "registry.local/worker:patched"
               for p in fleet.pods.values()) and len(fleet.pods) == 6
    assert fleet.route["status"]["epoch"] == 1
