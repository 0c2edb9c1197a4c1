"""The NetworkPolicy of a route's stage pods (pure): only the route's own stage pods,
gateway pods and certification Jobs, and the operator, reach the stages' gRPC port; only
the namespaces the chart names (Prometheus) reach their metrics port. Everything else is
refused at the network, whatever the stages' own TLS does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshnet.api import labels
from meshnet.reconcile.children import template_hash
from meshnet.reconcile.naming import child_name

NAMESPACE_NAME = "kubernetes.io/metadata.name"  # set by the API server on every namespace


@dataclass(frozen=True)
class PolicyConfig:
    """Operator-wide inputs of the policies (from the chart): where the operator runs and
    its pods' labels, and the namespaces that may scrape the stages' metrics."""

    enabled: bool = True
    operator_namespace: str = ""  # "": the operator is not let in by namespace
    operator_labels: Mapping[str, str] = field(default_factory=lambda: {
        "app.kubernetes.io/name": "meshnet-shard-operator"})
    metrics_namespaces: Sequence[str] = ()


def policy_name(route: str) -> str:
    return child_name(route, "stages")


def stage_policy(route: str, namespace: str, owner: Mapping[str, Any], grpc_port: int,
                 metrics_port: int, config: PolicyConfig,
                 child_labels: Mapping[str, str]) -> dict[str, Any]:
    """The policy of route `route`'s stage pods (those carrying its ROUTE label)."""
    own = [{"podSelector": {"matchLabels": {key: route}}}
           for key in (labels.ROUTE, labels.GATEWAY, labels.CERTIFY_ROUTE)]
    callers: list[dict[str, Any]] = list(own)
    if config.operator_namespace:
        callers.append({
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME: config.operator_namespace}},
            "podSelector": {"matchLabels": dict(config.operator_labels)}})
    rules: list[dict[str, Any]] = [
        {"from": callers, "ports": [{"protocol": "TCP", "port": grpc_port}]}]
    if config.metrics_namespaces:
        rules.append({
            "from": [{"namespaceSelector": {"matchExpressions": [{
                "key": NAMESPACE_NAME, "operator": "In",
                "values": list(config.metrics_namespaces)}]}}],
            "ports": [{"protocol": "TCP", "port": metrics_port}]})
    spec = {"podSelector": {"matchLabels": {labels.ROUTE: route}},
            "policyTypes": ["Ingress"], "ingress": rules}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": policy_name(route), "namespace": namespace,
                     "labels": {**child_labels, labels.TEMPLATE: template_hash(spec)},
                     "ownerReferences": [dict(owner)]},
        "spec": spec,
    }
