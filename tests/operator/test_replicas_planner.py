"""The pure planner with spec.replicas: a fleet of identical pipelines of one epoch, each
with its own pods, Service and links; scaling is placement, never a new identity."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshnet.reconcile.plan import Create, Delete, Plan
from meshnet.reconcile.route import (
    Observed,
    observe_pod,
    observe_referenced_artifact,
    observe_route,
    plan,
)

from .test_planner import CONFIG, NOW, kubelet

MakeArtifact = MakeRoute = Callable[..., dict[str, Any]]  # fixtures from conftest.py
IDENTITY = ("epoch", "routeDigest", "recipeDigest", "manifestDigest")


class Fleet:
    """A route, its artifact, and its pods and Services as the cluster would keep them."""

    def __init__(self, route: dict[str, Any], artifact: dict[str, Any]) -> None:
        self.route, self.artifact = route, artifact
        self.pods: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}

    def observe(self) -> Observed:
        pods = tuple(p for p in map(observe_pod, self.pods.values()) if p is not None)
        services = {int(s["metadata"]["labels"]["meshnet.dev/replica"]):
                    s["metadata"]["labels"]["meshnet.dev/template-hash"]
                    for s in self.services.values()}
        return Observed(observe_route(self.route), pods, services=services,
                        artifact=observe_referenced_artifact(self.artifact))

    def step(self) -> Plan:
        result = plan(self.observe(), CONFIG, NOW)
        kubelet(self.pods, result)
        for action in result.actions:
            if isinstance(action, Create) and action.obj["kind"] == "Service":
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


def reasons(plans: list[Plan]) -> list[str]:
    return [e.reason for p in plans for e in p.events]


def args(pod: dict[str, Any]) -> dict[str, str]:
    values = pod["spec"]["containers"][0]["args"]
    return dict(zip(values[::2], values[1::2], strict=True))


def test_scaling_never_changes_the_epoch_or_the_digests_nor_touches_running_replicas(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(), make_artifact())
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
    assert head["spec"]["hostname"] == "s0" and head["spec"]["subdomain"] == "r1-workers-r1"
    assert head["metadata"]["labels"]["meshnet.dev/replica"] == "1"
    assert {k: v for k, v in args(head).items() if k in ("--next-stage", "--ring-last")} == {
        "--next-stage": "s1.r1-workers-r1.default.svc:50051",
        "--ring-last": "s2.r1-workers-r1.default.svc:50051"}
    assert args(fleet.pods["r1-s0-e1"])["--next-stage"] == "s1.r1-workers.default.svc:50051"
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
        "s2.r1-workers-r1.default.svc:50051"
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


def test_scaling_down_deletes_the_replicas_past_spec_replicas_and_their_services(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    fleet = Fleet(make_route(replicas=3), make_artifact())
    fleet.converge()
    first = fleet.scale(1)[0]
    assert sorted(a.name for a in first.actions if isinstance(a, Delete)) == [
        "r1-s0-e1-r1", "r1-s0-e1-r2", "r1-s1-e1-r1", "r1-s1-e1-r2", "r1-s2-e1-r1",
        "r1-s2-e1-r2", "r1-workers-r1", "r1-workers-r2"]
    assert [e.reason for e in first.events] == ["ReplicaRemoved"]
    assert "replica 1 is past spec.replicas 1" in first.events[0].message
    assert sorted(fleet.pods) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
    assert sorted(fleet.services) == ["r1-workers"]
    status = fleet.route["status"]
    assert status["replicas"] == 1 and status["readyReplicas"] == 1
    assert len(status["replicaStatuses"]) == 1 and status["stagesReady"] == "3/3"


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
