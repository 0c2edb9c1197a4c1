"""The route's NetworkPolicy, evaluated the way a CNI does (pod and namespace selectors,
ports) against the labels the operator's own builders give each pod: who may reach a
stage's gRPC and metrics ports, and who may not."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from meshnet.api.certification import CertifiedLane
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.certify.gates import Gates
from meshnet.certify.job import JobInputs, certification_job
from meshnet.reconcile.plan import Create, Delete
from meshnet.reconcile.route import Observed, observe_referenced_artifact, observe_route, plan
from meshnet.reconcile.route.gatewayspec import gateway_deployment
from meshnet.reconcile.route.networkpolicy import NAMESPACE_NAME, PolicyConfig, stage_policy
from meshnet.reconcile.route.podspec import RouteRef, WorkerConfig, child_labels

from .conftest import artifact_body, route_body

NS = "ml"
OPERATOR_NS = "meshnet-system"
OPERATOR_LABELS = {"app.kubernetes.io/name": "meshnet-shard-operator",
                   "app.kubernetes.io/instance": "meshnet"}
POLICY = PolicyConfig(operator_namespace=OPERATOR_NS, operator_labels=OPERATOR_LABELS,
                      metrics_namespaces=("monitoring",))
CONFIG = WorkerConfig(images={"cpu": "w:1"}, pin_digest="p" * 64, gateway_image="op:1",
                      network_policy=POLICY)
GRPC, METRICS = CONFIG.grpc_port, CONFIG.metrics_port
NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)


def _matches(selector: Mapping[str, Any], tags: Mapping[str, str]) -> bool:
    if any(tags.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        assert expression["operator"] == "In"  # the only one the policy uses
        if tags.get(expression["key"]) not in expression["values"]:
            return False
    return True


def admits(policy: dict[str, Any], target: Mapping[str, str], port: int, source_ns: str,
           source: Mapping[str, str]) -> bool:
    """Whether `policy` lets a pod labelled `source` in `source_ns` reach `port` of a pod
    labelled `target` in the policy's namespace (NetworkPolicy semantics: a selected pod
    takes only what some rule admits; a peer with a namespaceSelector matches pods in those
    namespaces, one without only pods of the policy's namespace)."""
    spec = policy["spec"]
    if not _matches(spec["podSelector"], target):
        return True  # not selected: this policy says nothing about it
    namespace = {NAMESPACE_NAME: source_ns}
    for rule in spec.get("ingress") or []:
        if not any(p["port"] == port for p in rule.get("ports") or []):
            continue
        for peer in rule.get("from") or []:
            in_ns = _matches(peer["namespaceSelector"], namespace) if "namespaceSelector" in \
                peer else source_ns == policy["metadata"]["namespace"]
            if in_ns and _matches(peer.get("podSelector") or {}, source):
                return True
    return False


def route_objects(name: str) -> dict[str, Mapping[str, str]]:
    """The labels of a route's stage pod, gateway pod and certification pod, as the
    operator builds them."""
    body = route_body(name, namespace=NS)
    artifact = artifact_body(namespace=NS)
    observed = Observed(observe_route(body), artifact=observe_referenced_artifact(artifact))
    pods = [a.obj for a in plan(observed, CONFIG, NOW).actions
            if isinstance(a, Create) and a.obj["kind"] == "Pod"]
    ref = RouteRef(name, NS, f"uid-{name}")
    spec = ShardRouteSpec.model_validate(body["spec"])
    gateway = gateway_deployment(ref, spec.stages, spec.gateway, None, spec.recipe.speculation,
                                 CONFIG, [1])
    lane = CertifiedLane(backend="cpu", gpu_product="none", manifest_digest="a" * 64,
                         recipe_digest="b" * 64)
    job = certification_job(JobInputs(route=ref, lane=lane, stage_pod=pods[0],
                                      endpoints=["10.0.0.1:50051"], image="c:1", gates=Gates(),
                                      route_digest=None, epoch=1))
    return {"stage": pods[0]["metadata"]["labels"],
            "gateway": gateway["spec"]["template"]["metadata"]["labels"],
            "certify": job["spec"]["template"]["metadata"]["labels"]}


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    ref = RouteRef("r1", NS, "uid-r1")
    return stage_policy("r1", NS, {}, GRPC, METRICS, POLICY, child_labels(ref))


def test_only_the_routes_own_pods_and_the_operator_reach_a_stages_grpc_port(
        policy: dict[str, Any]) -> None:
    mine, theirs = route_objects("r1"), route_objects("r2")
    stage = mine["stage"]
    for role in ("stage", "gateway", "certify"):
        assert admits(policy, stage, GRPC, NS, mine[role]), role
        # another route's pods, in the same namespace, are refused
        assert not admits(policy, stage, GRPC, NS, theirs[role]), role
    assert admits(policy, stage, GRPC, OPERATOR_NS, OPERATOR_LABELS)
    refused = [
        (NS, {}),  # any other pod of the namespace
        (NS, {"app": "debug-shell"}),
        ("other", mine["gateway"]),  # the route's labels, copied in another namespace
        ("other", OPERATOR_LABELS),  # the operator's labels outside its namespace
        (OPERATOR_NS, {"app.kubernetes.io/name": "something-else"}),
        ("monitoring", {"app": "prometheus"}),  # metrics only
    ]
    for namespace, tags in refused:
        assert not admits(policy, stage, GRPC, namespace, tags), (namespace, tags)


def test_only_the_named_namespaces_reach_a_stages_metrics_port(policy: dict[str, Any]) -> None:
    mine = route_objects("r1")
    stage = mine["stage"]
    assert admits(policy, stage, METRICS, "monitoring", {"app": "prometheus"})
    assert not admits(policy, stage, METRICS, "default", {"app": "prometheus"})
    assert not admits(policy, stage, METRICS, NS, mine["gateway"])
    assert not admits(policy, stage, 8080, NS, mine["gateway"])  # no other port at all
    closed = stage_policy("r1", NS, {}, GRPC, METRICS, PolicyConfig(), {})
    assert not admits(closed, stage, METRICS, "monitoring", {"app": "prometheus"})


def test_the_policy_selects_every_stage_pod_of_the_route_and_nothing_else(
        policy: dict[str, Any]) -> None:
    mine, theirs = route_objects("r1"), route_objects("r2")
    selector = policy["spec"]["podSelector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert _matches(selector, mine["stage"])
    assert not any(_matches(selector, tags) for tags in (
        mine["gateway"], mine["certify"], *theirs.values()))


def test_the_planner_creates_the_policy_and_removes_it_when_the_chart_turns_it_off() -> None:
    body, artifact = route_body("r1", namespace=NS), artifact_body(namespace=NS)
    observed = Observed(observe_route(body), artifact=observe_referenced_artifact(artifact))
    created = [a.obj for a in plan(observed, CONFIG, NOW).actions
               if isinstance(a, Create) and a.obj["kind"] == "NetworkPolicy"]
    assert [p["metadata"]["name"] for p in created] == ["r1-stages"]
    assert created[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-r1"
    off = WorkerConfig(**{**CONFIG.__dict__, "network_policy": PolicyConfig(enabled=False)})
    existing = Observed(observe_route(body), artifact=observe_referenced_artifact(artifact),
                        network_policy_hash="old")
    assert [(a.kind, a.name) for a in plan(existing, off, NOW).actions
            if isinstance(a, Delete) and a.kind == "NetworkPolicy"] == [
        ("NetworkPolicy", "r1-stages")]
