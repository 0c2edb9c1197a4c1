"""The Helm chart with the real helm binary: lint, render, Kubernetes schema validation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from meshnet.api.crd import crd_documents
from meshnet.devtools.kube_tools import install
from meshnet.operator.settings import OperatorSettings
from meshnet.paths import repo_root
from meshnet.reconcile.route.networkpolicy import PolicyConfig

CHART = repo_root() / "charts/meshnet-shard-operator"
SCENARIOS = [None, *sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))]
MONITORING = "monitoring.coreos.com/v1/ServiceMonitor"
PROMETHEUS_OPERATOR = ["--api-versions", MONITORING,
                       "--api-versions", "monitoring.coreos.com/v1/PodMonitor",
                       "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]
K8S_VERSION = "1.35"
# The Prometheus Operator kinds are not core APIs: checked against the schemas beside this.
CRD_SCHEMAS = {kind: json.loads((Path(__file__).parent / "schemas" / f"{kind.lower()}.json")
                                .read_text())
               for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")}


@pytest.fixture(scope="module")
def helm() -> Path:
    return install()["helm"]  # idempotent: a no-op once ~/.cache/meshnet/bin has it


def run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def render(helm: Path, values: str | None = None, *extra: str) -> list[dict[str, Any]]:
    args = ["template", "meshnet", str(CHART), "--namespace", "meshnet-system", *extra]
    if values:
        args += ["-f", str(CHART / "ci" / values)]
    result = run(helm, *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("values", SCENARIOS)
def test_helm_lint_passes(helm: Path, values: str | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(CHART / "ci" / values)] if values else [])
    result = run(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", SCENARIOS)
def test_rendered_manifests_are_valid_kubernetes_objects(helm: Path, values: str | None) -> None:
    docs = render(helm, values, *PROMETHEUS_OPERATOR)
    for doc in docs:
        if doc["kind"] in CRD_SCHEMAS:
            jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_monitoring_schemas_refuse_a_misspelt_field(helm: Path) -> None:
    docs = render(helm, "monitoring-values.yaml", *PROMETHEUS_OPERATOR)
    monitor, _ = by_kind(docs, "PodMonitor")
    monitor["spec"]["podMetricEndpoints"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError, match="podMetricEndpoints"):
        jsonschema.validate(monitor, CRD_SCHEMAS["PodMonitor"])


def test_a_misspelt_value_fails_the_install(helm: Path) -> None:
    result = run(helm, "template", "x", str(CHART), "--set", "imagee.tag=1")
    assert result.returncode != 0
    assert "additional properties 'imagee' not allowed" in result.stderr


def test_the_operator_runs_once_with_recreate_a_liveness_probe_and_restricted_security(
        helm: Path) -> None:
    (deployment,) = by_kind(render(helm), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MESHNET_WORKER_IMAGE_CUDA"] == "meshnet/meshnet-shard-worker-cuda:0.1.0"
    assert env["MESHNET_PROVISIONER_IMAGE"] == "meshnet/meshnet-operator:0.1.0"  # its own
    assert env["MESHNET_GATEWAY_IMAGE"] == "meshnet/meshnet-operator:0.1.0"  # `meshnet serve`
    assert container["image"] == "meshnet/meshnet-operator:0.1.0"
    # each route's NetworkPolicy lets in this operator's pods and the monitoring namespace
    assert env["MESHNET_NETWORK_POLICY"] == "true"
    assert env["MESHNET_METRICS_NAMESPACES"] == "monitoring"
    labels = dict(p.split("=") for p in str(env["MESHNET_OPERATOR_POD_LABELS"]).split(","))
    assert labels and labels.items() <= spec["template"]["metadata"]["labels"].items()
    namespace = next(e for e in container["env"] if e["name"] == "MESHNET_OPERATOR_NAMESPACE")
    assert namespace["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}



def operator_policy(deployment: dict[str, Any]) -> PolicyConfig:
    """The NetworkPolicy inputs the operator reads from the chart's environment (the
    namespace as the downward API fills it in)."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") or "meshnet-system" for e in container["env"]
           if "value" in e or e["name"] == "MESHNET_OPERATOR_NAMESPACE"}
    return OperatorSettings.from_env({**env, "MESHNET_PIN_DIGEST": "p" * 64}).network_policy


def test_the_route_policies_let_in_this_operators_pods_and_the_values_turn_them_off(
        helm: Path) -> None:
    (deployment,) = by_kind(render(helm), "Deployment")
    policy = operator_policy(deployment)
    assert policy.enabled and policy.metrics_namespaces == ("monitoring",)
    assert policy.operator_namespace == "meshnet-system"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy.operator_labels and policy.operator_labels.items() <= pod_labels.items()
    assert "app.kubernetes.io/instance" in policy.operator_labels  # this release's pods only
    (deployment,) = by_kind(render(helm, None, "--set", "networkPolicy.enabled=false",
                                   "--set", "networkPolicy.metricsNamespaces={prom,obs}"),
                            "Deployment")
    policy = operator_policy(deployment)
    assert not policy.enabled and policy.metrics_namespaces == ("prom", "obs")

def rules(role: dict[str, Any]) -> dict[str, set[str]]:
    return {f"{g}/{r}": set(rule["verbs"]) for rule in role["rules"]
            for g in rule["apiGroups"] for r in rule["resources"]}


NAMESPACED = {
    "meshnet.dev/shardroutes": {"get", "list", "watch", "patch"},
    "meshnet.dev/shardroutes/status": {"patch"},
    "meshnet.dev/modelartifacts": {"get", "list", "watch", "patch"},
    "meshnet.dev/modelartifacts/status": {"patch"},
    "/pods": {"list", "watch", "create", "delete"},
    "/services": {"list", "watch", "create", "patch", "delete"},
    "apps/deployments": {"list", "watch", "create", "patch", "delete"},
    "/events": {"create"},
    "batch/jobs": {"get", "list", "watch", "create", "delete"},
    "/configmaps": {"list", "watch", "create", "delete"},
    "/secrets": {"get", "list", "watch", "create", "patch"},
    "networking.k8s.io/networkpolicies": {"list", "watch", "create", "patch", "delete"},
}
DISCOVERY = {"apiextensions.k8s.io/customresourcedefinitions": {"list", "watch"},
             "/namespaces": {"list", "watch", "get"}, "/nodes": {"get", "list", "watch", "patch"}}


def test_rbac_grants_exactly_the_verbs_the_operator_uses(helm: Path) -> None:
    (cluster_role,) = by_kind(render(helm), "ClusterRole")
    assert rules(cluster_role) == DISCOVERY | NAMESPACED
    docs = render(helm, "namespaced-values.yaml")
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert rules(cluster_role) == DISCOVERY
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml", "serving"]
    assert all(rules(r) == NAMESPACED for r in roles)
    assert len(by_kind(docs, "RoleBinding")) == 2


def test_the_service_monitor_needs_the_flag_and_the_prometheus_operator_api(helm: Path) -> None:
    assert not by_kind(render(helm, "servicemonitor-values.yaml"), "ServiceMonitor")
    assert not by_kind(render(helm, None, "--api-versions", MONITORING), "ServiceMonitor")
    (monitor,) = by_kind(render(helm, "servicemonitor-values.yaml", "--api-versions", MONITORING),
                         "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == [{
        "port": "metrics", "path": "/metrics", "interval": "15s", "honorLabels": True,
        "relabelings": [{"targetLabel": "job", "replacement": "meshnet-operator"}]}]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_crds_are_the_generated_ones_kept_on_uninstall_and_optional(helm: Path) -> None:
    crds = by_kind(render(helm), "CustomResourceDefinition")
    generated = {d["metadata"]["name"]: d for d in crd_documents().values()}
    assert {c["metadata"]["name"] for c in crds} == set(generated)
    for crd in crds:
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["spec"] == generated[crd["metadata"]["name"]]["spec"]
    assert not by_kind(render(helm, "pinned-image-values.yaml"), "CustomResourceDefinition")


def test_an_image_digest_pins_the_operator_image(helm: Path) -> None:
    (deployment,) = by_kind(render(helm, "pinned-image-values.yaml"), "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == ("registry.internal/platform/meshnet-operator@sha256:" + "0" * 64)


def test_the_stage_and_gateway_pod_monitors_need_the_flag_and_the_prometheus_operator_api(
        helm: Path) -> None:
    assert not by_kind(render(helm, "monitoring-values.yaml"), "PodMonitor")
    assert not by_kind(render(helm, None, *PROMETHEUS_OPERATOR), "PodMonitor")
    monitor, gateways = by_kind(render(helm, "monitoring-values.yaml", *PROMETHEUS_OPERATOR),
                                "PodMonitor")
    (gateway,) = gateways["spec"]["podMetricsEndpoints"]
    assert gateway["port"] == "http" and gateway["relabelings"] == [
        {"targetLabel": "job", "replacement": "meshnet-gateway"}]
    assert {"key": "meshnet.dev/gateway", "operator": "Exists"} in \
        gateways["spec"]["selector"]["matchExpressions"]
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "meshnet-operator"}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["interval"]) == ("metrics", "15s")
    assert {r["targetLabel"] for r in endpoint["relabelings"]} == {"route", "stage", "job"}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    watching = by_kind(render(helm, "namespaced-values.yaml", "--set",
                              "monitoring.podMonitor.enabled=true", *PROMETHEUS_OPERATOR),
                       "PodMonitor")
    assert [w["spec"]["namespaceSelector"] for w in watching] == [
        {"matchNames": ["ml", "serving"]}] * 2


def alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = by_kind(docs, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_the_prometheus_rule_needs_the_flag_and_the_api_and_takes_thresholds_from_values(
        helm: Path) -> None:
    assert not by_kind(render(helm, "monitoring-values.yaml"), "PrometheusRule")
    assert not by_kind(render(helm, None, *PROMETHEUS_OPERATOR), "PrometheusRule")
    tuned = alerts(render(helm, "monitoring-values.yaml", *PROMETHEUS_OPERATOR))
    assert tuned["MeshnetRouteNotReady"]["for"] == "3m"
    assert tuned["MeshnetForwardLatencyHigh"]["expr"].endswith("> 0.5")
    assert tuned["MeshnetStageUnreachable"]["annotations"]["runbook_url"] == (
        "https://docs.example.internal/meshnet/runbooks#meshnetstageunreachable")
    # Without the operator's ServiceMonitor nothing scrapes it: no OperatorDown to misfire.
    untuned = alerts(render(helm, None, "--set", "monitoring.prometheusRule.enabled=true",
                            *PROMETHEUS_OPERATOR))
    assert "MeshnetOperatorDown" in tuned and "MeshnetOperatorDown" not in untuned
    assert untuned["MeshnetRouteNotReady"]["for"] == "10m"


def test_the_dashboards_are_config_maps_for_the_grafana_sidecar(helm: Path) -> None:
    shipped = {p.name: p.read_text() for p in (CHART / "files/dashboards").glob("*.json")}
    assert len(shipped) == 3
    maps = by_kind(render(helm), "ConfigMap")
    assert {name for m in maps for name in m["data"]} == set(shipped)
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "Meshnet"}
        assert config_map["metadata"]["namespace"] == "meshnet-system"
        ((name, text),) = config_map["data"].items()
        assert json.loads(text) == json.loads(shipped[name])
    moved = by_kind(render(helm, "monitoring-values.yaml"), "ConfigMap")
    assert all(m["metadata"]["labels"]["grafana_dashboard_meshnet"] == "yes"
               and m["metadata"]["annotations"] == {"grafana_folder": "Inference"}
               and m["metadata"]["namespace"] == "monitoring" for m in moved)
    assert not by_kind(render(helm, "no-monitoring-values.yaml"), "ConfigMap")
