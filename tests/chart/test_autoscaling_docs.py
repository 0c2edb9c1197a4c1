"""docs/autoscaling.md's manifests as a user would copy them: each one valid for its kind's
schema, aimed at a ShardRoute, and every PromQL query in them accepted by the real promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meshnet.api import shardroute
from meshnet.api.common import API_VERSION, GROUP
from meshnet.api.crd import crd_documents
from meshnet.gateway.metrics import GatewayMetrics
from meshnet.paths import repo_root

DOC = repo_root() / "docs" / "autoscaling.md"
K8S_VERSION = "1.35"
SCALED_OBJECT = json.loads((Path(__file__).parent / "schemas" / "scaledobject.json").read_text())
# prometheus-adapter fills these Go templates in before it sends a query.
ADAPTER_TEMPLATES = {"<<.Series>>": "meshnet_num_requests_waiting",
                     "<<.LabelMatchers>>": 'route="chat"'}


def manifests() -> dict[str, dict[str, Any]]:
    """The page's ```yaml blocks, by kind."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    docs = [yaml.safe_load(block) for block in blocks]
    return {doc["kind"]: doc for doc in docs}


def adapter_rules() -> list[dict[str, Any]]:
    config = yaml.safe_load(manifests()["ConfigMap"]["data"]["config.yaml"])
    rules: list[dict[str, Any]] = config["externalRules"]
    return rules


def test_the_page_gives_the_adapter_config_an_hpa_and_a_keda_scaled_object() -> None:
    assert set(manifests()) == {"ConfigMap", "HorizontalPodAutoscaler", "ScaledObject"}


@pytest.mark.parametrize("kind", ["ConfigMap", "HorizontalPodAutoscaler"])
def test_core_manifests_are_valid_kubernetes_objects(kind: str) -> None:
    kubernetes_validate.validate(manifests()[kind], K8S_VERSION, strict=True)


def test_the_scaled_object_is_valid_for_keda() -> None:
    jsonschema.validate(manifests()["ScaledObject"], SCALED_OBJECT)


def test_the_keda_schema_refuses_a_misspelt_field() -> None:
    scaled = manifests()["ScaledObject"]
    scaled["spec"]["minReplicas"] = scaled["spec"].pop("minReplicaCount")
    with pytest.raises(jsonschema.ValidationError, match="minReplicas"):
        jsonschema.validate(scaled, SCALED_OBJECT)


@pytest.mark.parametrize("kind", ["HorizontalPodAutoscaler", "ScaledObject"])
def test_both_autoscalers_scale_a_shard_route(kind: str) -> None:
    target = manifests()[kind]["spec"]["scaleTargetRef"]
    assert target["apiVersion"] == API_VERSION and target["kind"] == shardroute.KIND
    crd = crd_documents()[f"{GROUP}_{shardroute.PLURAL}.yaml"]
    (version,) = crd["spec"]["versions"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"


def test_the_hpa_reads_the_metric_the_adapter_serves() -> None:
    (rule,) = adapter_rules()
    (metric,) = manifests()["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert set(rule) <= {"seriesQuery", "resources", "name", "metricsQuery", "seriesFilters"}


def test_keda_wakes_a_route_at_zero_on_its_first_refused_request() -> None:
    spec = manifests()["ScaledObject"]["spec"]
    (trigger,) = spec["triggers"]
    assert spec["minReplicaCount"] == 0 and trigger["metadata"]["activationThreshold"] == "0"
    assert 'status="unavailable"' in trigger["metadata"]["query"]


def queries() -> list[str]:
    found = [manifests()["ScaledObject"]["spec"]["triggers"][0]["metadata"]["query"]]
    for rule in adapter_rules():
        found.append(rule["seriesQuery"])
        query = rule["metricsQuery"]
        for template, value in ADAPTER_TEMPLATES.items():
            query = query.replace(template, value)
        found.append(query)
    return found


def per_replica_gauges() -> set[str]:
    """The gateway's families labelled by replica, as its real metrics export them."""
    metrics = GatewayMetrics("chat")
    metrics.running.show({"0": 1})
    metrics.kv_usage.show({"0": 0.5})
    metrics.replicas.show([("0", True, 1)])
    text = generate_latest(metrics.registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples
            if "replica" in s.labels}


def test_every_query_aggregates_the_per_replica_gauges_it_reads() -> None:
    """A per-replica gauge read bare would give the autoscaler one series per replica."""
    gauges = per_replica_gauges()
    assert {"meshnet_num_requests_running", "vllm:kv_cache_usage_perc"} <= gauges
    for query in queries():
        for name in gauges:
            for bare in re.finditer(rf"(?<![\w:]){re.escape(name)}(?![\w:])", query):
                before = query[:bare.start()].rstrip()
                assert re.search(r"(sum|max|avg|min)( by \(\w+\))? ?\($", before), (name, query)


def test_every_query_on_the_page_parses_in_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run `make deps` (Debian package prometheus)"
    rules = [{"record": f"doc:query_{n}", "expr": query} for n, query in enumerate(queries())]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "doc", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
