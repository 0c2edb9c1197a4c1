"""spec.placement in the pure planner: a Measured route's nodes get probe agents and a
measuring Job; the links it hands back become status.placement; a planted slow leg in the
ring reassigns the stages to the nodes as a new epoch, noise under the margin does not, a
pinned stage keeps its node, a failed measurement is a reason in status; a Static route is
never measured or moved."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from meshnet.placement.order import MeasuredLink
from meshnet.placement.report import links_document
from meshnet.reconcile.plan import Create, Delete, Plan
from meshnet.reconcile.route import Observed, WorkerConfig, observe_pod, observe_route, plan
from meshnet.reconcile.route.networkpolicy import PolicyConfig
from meshnet.reconcile.route.observed import observe_referenced_artifact
from meshnet.reconcile.route.placement import (
    MARGIN,
    ObservedAgent,
    ObservedMeasurement,
    ObservedProbes,
    PlacementConfig,
)
from meshnet.timestamps import rfc3339

CONFIG = WorkerConfig(images={"cpu": "meshnet/worker-cpu:1"}, pin_digest="p" * 64,
                      network_policy=PolicyConfig(enabled=False))
PLACEMENT = PlacementConfig(image="meshnet/operator:1")
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
NODES = ("node-a", "node-b", "node-c")
FAST = MeasuredLink(rtt_s=0.002, bytes_per_s=125e6)
SLOW = MeasuredLink(rtt_s=0.060, bytes_per_s=125e6)
MakeArtifact = MakeRoute = Callable[..., dict[str, Any]]  # fixtures from conftest.py


def mesh(**planted: MeasuredLink) -> dict[tuple[str, str], MeasuredLink]:
    links = {pair: FAST for pair in itertools.permutations(NODES, 2)}
    for name, link in planted.items():
        a, b = name.split("_")
        links[f"node-{a}", f"node-{b}"] = link
    return links


class Cluster:
    """A route's pods (scheduled s0, s1, s2 on node-a, node-b, node-c) and the probes."""

    def __init__(self, route: dict[str, Any], artifact: dict[str, Any]) -> None:
        self.route, self.artifact = route, artifact
        self.pods: dict[str, dict[str, Any]] = {}
        self.probes = ObservedProbes(fresh_token="t0ken")
        self.placed = dict(zip(("s0", "s1", "s2"), NODES, strict=True))

    def step(self, now: datetime = NOW) -> Plan:
        observed = Observed(observe_route(self.route), tuple(
            p for p in map(observe_pod, self.pods.values()) if p is not None),
            services={0: "x"}, artifact=observe_referenced_artifact(self.artifact),
            probes=self.probes)
        result = plan(observed, CONFIG, now, PLACEMENT)
        for action in result.actions:
            if isinstance(action, Delete) and action.kind == "Pod":
                self.pods.pop(action.name, None)
            elif isinstance(action, Create) and action.obj["kind"] == "Pod" \
                    and "meshnet.dev/stage" in action.obj["metadata"]["labels"]:
                self.schedule(copy.deepcopy(action.obj))
        if result.status is not None:
            self.route["status"] = result.status
        return result

    def schedule(self, pod: dict[str, Any]) -> None:
        """The scheduler: a pinned pod on its node, another where `placed` says."""
        stage = pod["metadata"]["labels"]["meshnet.dev/stage"]
        terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
        node = terms[0]["matchFields"][0]["values"][0] if terms else self.placed[stage]
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running", "podIP": "10.0.0.9",
                         "conditions": [{"type": "Ready", "status": "True"}]}
        self.pods[pod["metadata"]["name"]] = pod

    def settle(self) -> None:
        """Plan until the stage pods stop changing."""
        for _ in range(10):
            before = set(self.pods)
            self.step()
            if set(self.pods) == before:
                return
        raise AssertionError("no steady state")

    def measured(self, links: dict[tuple[str, str], MeasuredLink]) -> None:
        """The agents ran and the Job finished with `links` (a real links document)."""
        self.probes = ObservedProbes(
            agents=tuple(ObservedAgent(f"probe-{n}", n, "10.1.0.1", True) for n in NODES),
            jobs=(ObservedMeasurement("r1-placement", _key(), True,
                                      links_document(list(NODES), links)),),
            token_secret="r1-probe-token")

    def stage_nodes(self) -> dict[str, str]:
        return {p["metadata"]["labels"]["meshnet.dev/stage"]: p["spec"]["nodeName"]
                for p in self.pods.values()}


def _key() -> str:
    from meshnet.reconcile.route.placement import nodes_key
    return nodes_key(NODES)


def creates(result: Plan, kind: str) -> list[dict[str, Any]]:
    return [a.obj for a in result.actions if isinstance(a, Create) and a.obj["kind"] == kind]


def measured_route(make_route: MakeRoute, make_artifact: MakeArtifact,
                   placement: str = "Measured", **extra: Any) -> Cluster:
    cluster = Cluster(make_route(placement=placement, recipe={"lane": "cpu",
                                                              "topology": "ring"},
                                 rollout={"drainSeconds": 0}, **extra),
                      make_artifact())
    cluster.settle()
    return cluster


def reassigned_route(make_route: MakeRoute, make_artifact: MakeArtifact) -> Cluster:
    """A measured route whose slow b -> c leg moved its stages (epoch 2), settled there."""
    cluster = measured_route(make_route, make_artifact)
    cluster.measured(mesh(b_c=SLOW))
    cluster.step()
    cluster.probes = ObservedProbes(token_secret="r1-probe-token")
    cluster.settle()
    return cluster


def test_a_measured_route_gets_an_agent_on_each_node_then_a_job_naming_them(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    cluster = measured_route(make_route, make_artifact)
    first = cluster.step()
    agents = creates(first, "Pod")
    assert sorted(a["metadata"]["annotations"]["meshnet.dev/placement-node"]
                  for a in agents) == sorted(NODES)
    assert all("meshnet.dev/route" not in a["metadata"]["labels"] for a in agents)
    assert [s["stringData"]["token"] for s in creates(first, "Secret")] == ["t0ken"]
    assert not creates(first, "Job")  # not before every agent is ready
    assert cluster.route["status"]["placement"]["reason"] == "Measuring"

    cluster.probes = ObservedProbes(
        agents=tuple(ObservedAgent(f"probe-{n}", n, f"10.1.0.{i}", True)
                     for i, n in enumerate(NODES)), token_secret="r1-probe-token")
    (job,) = creates(cluster.step(), "Job")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:5] == ["links", "place", "node-a=10.1.0.0:7070", "node-b=10.1.0.1:7070",
                        "node-c=10.1.0.2:7070"]
    assert "--termination-log" in args and "--token-file" in args


def test_a_planted_slow_leg_in_the_ring_reassigns_the_stages_as_a_new_epoch(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    cluster = measured_route(make_route, make_artifact)
    assert cluster.route["status"]["epoch"] == 1
    # s0 on a, s1 on b, s2 on c: the ring a -> b -> c -> a crosses b -> c on every token
    cluster.measured(mesh(b_c=SLOW))
    result = cluster.step()

    placement = cluster.route["status"]["placement"]
    assert placement["reason"] == "Reassigned", placement
    assert placement["currentOrder"] == list(NODES)
    assert placement["currentSeconds"] > placement["bestSeconds"] + 0.025
    best = placement["bestOrder"]
    legs = set(itertools.pairwise([*best, best[0]]))
    assert ("node-b", "node-c") not in legs, best
    assert len(placement["links"]) == 6 and placement["measuredAt"] == rfc3339(NOW)
    assert placement["assignment"] == dict(zip(("s0", "s1", "s2"), best, strict=True))
    assert cluster.route["status"]["epoch"] == 2
    assert any(e.reason == "EpochAdvanced" and "reassigned" in e.message
               for e in result.events)
    assert {a.name for a in result.actions if isinstance(a, Delete) and a.kind == "Job"} \
        == {"r1-placement"}  # the Job and its agents go once read

    cluster.probes = ObservedProbes(token_secret="r1-probe-token")
    cluster.settle()
    assert cluster.stage_nodes() == placement["assignment"]
    assert {p["metadata"]["labels"]["meshnet.dev/epoch"] for p in cluster.pods.values()} == {"2"}
    # the new order is the best: measured again later, nothing moves again
    again = cluster.step(NOW + timedelta(minutes=5))
    assert cluster.route["status"]["placement"]["reason"] == "Measured"
    assert cluster.route["status"]["epoch"] == 2 and not again.epoch_advanced


def test_a_gain_under_the_margin_moves_nothing(make_route: MakeRoute,
                                              make_artifact: MakeArtifact) -> None:
    cluster = measured_route(make_route, make_artifact)
    # b -> c a little slower: the best order saves less than MARGIN of the cycle
    noisy = MeasuredLink(rtt_s=FAST.rtt_s * (1 + MARGIN), bytes_per_s=125e6)
    cluster.measured(mesh(b_c=noisy))
    result = cluster.step()
    placement = cluster.route["status"]["placement"]
    assert placement["reason"] == "Measured", placement
    assert placement["bestSeconds"] < placement["currentSeconds"]
    assert "assignment" not in placement
    assert cluster.route["status"]["epoch"] == 1 and not result.epoch_advanced
    assert not creates(result, "Pod")


def test_a_pinned_stage_keeps_its_node(make_route: MakeRoute,
                                       make_artifact: MakeArtifact) -> None:
    body = make_route(placement="Measured", recipe={"lane": "cpu", "topology": "ring"})
    body["spec"]["stages"][1]["nodeSelector"] = {"gpu": "big"}  # s1 stays on node-b
    cluster = Cluster(body, make_artifact())
    cluster.settle()
    cluster.measured(mesh(b_c=SLOW))  # unpinned, a -> c -> b would be chosen (s1 on c)
    cluster.step()
    placement = cluster.route["status"]["placement"]
    assert placement["reason"] == "Reassigned"
    assert placement["bestOrder"] == ["node-c", "node-b", "node-a"]  # as cheap, s1 kept
    assert placement["assignment"] == {"s0": "node-c", "s2": "node-a"}


def test_a_failed_measurement_is_a_reason_in_status_and_is_retried_later(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    cluster = measured_route(make_route, make_artifact)
    cluster.probes = ObservedProbes(jobs=(ObservedMeasurement(
        "r1-placement", _key(), True, "Error: probe agent 10.1.0.1:7070: timed out"),),
        token_secret="r1-probe-token")
    result = cluster.step()
    placement = cluster.route["status"]["placement"]
    assert placement["reason"] == "MeasurementFailed"
    assert "probe agent 10.1.0.1:7070: timed out" in placement["message"]
    assert cluster.route["status"]["epoch"] == 1
    assert result.requeue_after == PLACEMENT.retry_seconds
    cluster.probes = ObservedProbes(token_secret="r1-probe-token")
    assert not creates(cluster.step(NOW + timedelta(seconds=60)), "Pod")  # not yet
    later = cluster.step(NOW + timedelta(seconds=PLACEMENT.retry_seconds + 1))
    assert len(creates(later, "Pod")) == 3  # agents again


def test_a_static_route_is_never_measured_or_moved(make_route: MakeRoute,
                                                   make_artifact: MakeArtifact) -> None:
    cluster = measured_route(make_route, make_artifact, placement="Static")
    cluster.measured(mesh(b_c=SLOW))  # leftovers of a Measured past
    result = cluster.step()
    assert cluster.route["status"].get("placement") is None
    assert not creates(result, "Pod") and not creates(result, "Job")
    assert {a.name for a in result.actions if isinstance(a, Delete)} == {
        "probe-node-a", "probe-node-b", "probe-node-c", "r1-placement"}
    assert cluster.route["status"]["epoch"] == 1


def test_a_stage_that_cannot_be_scheduled_on_its_assigned_node_is_released(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    cluster = reassigned_route(make_route, make_artifact)
    assert cluster.route["status"]["epoch"] == 2
    s0 = next(p for p in cluster.pods.values()
              if p["metadata"]["labels"]["meshnet.dev/stage"] == "s0")
    s0["status"] = {"phase": "Pending", "conditions": [  # its node is gone
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/2 nodes are available"}]}
    result = cluster.step()
    placement = cluster.route["status"]["placement"]
    assert placement["reason"] == "WaitingForNodes" and "s0" in placement["message"]
    assert "assignment" not in placement
    assert result.epoch_advanced and cluster.route["status"]["epoch"] == 3
    new = [p for p in creates(result, "Pod") if p["metadata"]["labels"].get(
        "meshnet.dev/epoch") == "3"]
    assert len(new) == 3 and not any(
        "nodeAffinity" in (p["spec"].get("affinity") or {}) for p in new)


def test_agents_that_never_become_ready_fail_the_measurement_in_time(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    cluster = measured_route(make_route, make_artifact)
    cluster.step()  # agents created
    cluster.probes = ObservedProbes(
        agents=tuple(ObservedAgent(f"probe-{n}", n, "10.1.0.1" if n != "node-c" else "",
                                   n != "node-c") for n in NODES),
        token_secret="r1-probe-token")
    assert cluster.step(NOW + timedelta(seconds=60)).requeue_after is not None
    assert cluster.route["status"]["placement"]["reason"] == "Measuring"
    late = NOW + timedelta(seconds=2 * PLACEMENT.deadline_seconds + 1)
    result = cluster.step(late)
    placement = cluster.route["status"]["placement"]
    assert placement["reason"] == "MeasurementFailed"
    assert "no ready probe agent on node-c" in placement["message"]
    assert {a.name for a in result.actions if isinstance(a, Delete)} == {
        f"probe-{n}" for n in NODES}


def test_scaling_a_reassigned_route_keeps_the_epoch_and_pins_only_replica_0(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    cluster = reassigned_route(make_route, make_artifact)
    assignment = cluster.route["status"]["placement"]["assignment"]
    cluster.route["spec"]["replicas"] = 2
    result = cluster.step()
    assert not result.epoch_advanced and cluster.route["status"]["epoch"] == 2
    placement = cluster.route["status"]["placement"]
    assert placement["reason"] == "ReplicasUnsupported"
    assert placement["assignment"] == assignment
    added = creates(result, "Pod")
    assert len(added) == 3 and all(p["metadata"]["labels"]["meshnet.dev/replica"] == "1"
                                   and "nodeAffinity" not in p["spec"]["affinity"]
                                   for p in added)


def packs(pod: dict[str, Any]) -> bool:
    args = pod["spec"]["containers"][0]["args"]
    return "--boundary-compression" in args \
        and args[args.index("--boundary-compression") + 1] == "shuffle-lz4"


def test_a_measured_slow_leg_turns_packing_on_for_its_sending_stage_only(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    body = make_route(placement="Measured", recipe={"lane": "cpu", "topology": "ring"})
    for stage in body["spec"]["stages"]:  # every stage stays where it is
        stage["nodeSelector"] = {"pool": "pinned"}
    cluster = Cluster(body, make_artifact())
    cluster.settle()
    assert not any(map(packs, cluster.pods.values()))
    before = dict(cluster.pods)
    # b -> c (s1 -> s2) measured at 100 Mbit/s, below the break-even; every other leg 1 Gbit/s
    cluster.measured(mesh(b_c=MeasuredLink(rtt_s=FAST.rtt_s, bytes_per_s=12.5e6)))
    cluster.step()
    cluster.probes = ObservedProbes(token_secret="r1-probe-token")
    cluster.settle()

    status = cluster.route["status"]
    assert status["placement"]["reason"] == "AllStagesPinned"
    assert status["compressedLegs"] == ["s1->s2"]
    by_stage = {p["metadata"]["labels"]["meshnet.dev/stage"]: p for p in cluster.pods.values()}
    assert {s: packs(p) for s, p in by_stage.items()} == {"s0": False, "s1": True, "s2": False}
    # the same epoch: only s1's pod was restarted (in place) to take the flag
    assert status["epoch"] == 1
    assert {n for n, pod in before.items() if cluster.pods.get(n) is pod} \
        == {"r1-s0-e1", "r1-s2-e1"}
    # measured again a little faster, still within the hysteresis: nothing restarts
    cluster.measured(mesh(b_c=MeasuredLink(rtt_s=FAST.rtt_s, bytes_per_s=53e6)))
    pods = dict(cluster.pods)
    cluster.step(NOW + timedelta(hours=2))
    assert cluster.pods.keys() == pods.keys()
    assert cluster.route["status"]["compressedLegs"] == ["s1->s2"]


def test_boundary_compression_off_never_packs_a_slow_leg(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    body = make_route(placement="Measured", boundaryCompression="Off",
                      recipe={"lane": "cpu", "topology": "ring"})
    for stage in body["spec"]["stages"]:
        stage["nodeSelector"] = {"pool": "pinned"}
    cluster = Cluster(body, make_artifact())
    cluster.settle()
    cluster.measured(mesh(b_c=MeasuredLink(rtt_s=FAST.rtt_s, bytes_per_s=12.5e6)))
    cluster.step()
    cluster.settle()
    assert not any(map(packs, cluster.pods.values()))
    assert cluster.route["status"].get("compressedLegs") is None
