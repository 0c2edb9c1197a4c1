"""The generated CRDs: checked in without drift, structural, and useful to kubectl."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from meshnet.api.crd import crd_documents, render
from meshnet.cli.crds import drift
from meshnet.paths import repo_root


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for key, child in (node.get("properties") or {}).items():
        out += walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        out += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


def schema(kind: str) -> dict[str, Any]:
    crd = next(d for d in crd_documents().values() if d["spec"]["names"]["kind"] == kind)
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def test_the_checked_in_crds_match_the_models() -> None:
    assert drift(repo_root()) == []


def test_meshnet_crds_check_exits_zero_when_clean_and_one_after_a_hand_edit(tmp_path: Path) -> None:
    for folder in ("crds", "charts/meshnet-shard-operator/files/crds"):
        shutil.copytree(repo_root() / folder, tmp_path / folder)
    meshnet = str(Path(sys.executable).parent / "meshnet")
    check = [meshnet, "crds", "--check", "--root", str(tmp_path)]
    clean = subprocess.run([*check], capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr
    target = tmp_path / "crds/meshnet.dev_shardroutes.yaml"
    target.write_text(target.read_text().replace("Epoch", "Era"))
    drifted = subprocess.run([*check], capture_output=True, text=True)
    assert drifted.returncode == 1
    assert "meshnet.dev_shardroutes.yaml: differs from the models" in drifted.stderr


def test_every_schema_node_is_structural_with_a_type_and_a_description() -> None:
    for kind in ("ShardRoute", "ModelArtifact"):
        for path, node in walk(schema(kind)):
            if path in ("", ".metadata") or node.get("x-kubernetes-int-or-string"):
                continue
            assert "type" in node, f"{kind}{path} has no type"
            if not path.endswith(("[]", "{}")):  # kubectl explain shows the list/map's own
                assert node.get("description"), f"{kind}{path} has no description"
            assert not {"$ref", "oneOf", "title", "nullable"} & set(node), f"{kind}{path}"
            if "properties" in node:
                assert "additionalProperties" not in node, f"{kind}{path}"


def test_crds_have_status_short_names_and_the_printer_columns_operators_expect() -> None:
    docs = {d["spec"]["names"]["kind"]: d for d in crd_documents().values()}
    route, artifact = docs["ShardRoute"]["spec"], docs["ModelArtifact"]["spec"]
    assert route["names"]["shortNames"] == ["sr"] and artifact["names"]["shortNames"] == ["ma"]
    for spec in (route, artifact):
        assert spec["scope"] == "Namespaced" and spec["group"] == "meshnet.dev"
    assert artifact["versions"][0]["subresources"] == {"status": {}}
    assert set(route["versions"][0]["subresources"]) == {"status", "scale"}
    printed = {c["name"]: c["jsonPath"] for c in route["versions"][0]["additionalPrinterColumns"]}
    assert list(printed) == ["Ready", "Epoch", "Replicas", "Serving", "Updated", "Stages",
                             "Coverage", "Acceptance", "Endpoint", "Age"]
    # a rollout is followed as a Deployment's: replicas served at the new epoch of spec.replicas
    assert printed["Updated"] == ".status.updatedReplicas"
    assert "updatedReplicas" in route["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["status"]["properties"]
    columns = [c["name"] for c in artifact["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Ready", "Files", "Size", "Digest", "Age"]


def test_the_crd_yaml_round_trips_and_quantities_are_int_or_string() -> None:
    for name, doc in crd_documents().items():
        assert yaml.safe_load(render(doc)) == doc, name
    requests = schema("ShardRoute")["properties"]["spec"]["properties"]["stages"]["items"][
        "properties"]["resources"]["properties"]["requests"]["additionalProperties"]
    assert requests["x-kubernetes-int-or-string"] is True
    assert requests["anyOf"] == [{"type": "integer"}, {"type": "string"}]


def test_the_route_scale_subresource_points_at_fields_of_the_right_types() -> None:
    """kubectl scale, an HPA and KEDA read and write these paths: each must exist in the
    schema with the type autoscaling/v1 Scale gives it (replicas integers, selector a
    string), spec.replicas defaulting to one pipeline and never negative."""
    crd = next(d for d in crd_documents().values() if d["spec"]["names"]["kind"] == "ShardRoute")
    scale = crd["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {"specReplicasPath": ".spec.replicas",
                     "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}
    nodes = dict(walk(schema("ShardRoute")))
    assert nodes[scale["specReplicasPath"]]["type"] == "integer"
    assert nodes[scale["specReplicasPath"]]["default"] == 1
    assert nodes[scale["specReplicasPath"]]["minimum"] == 0
    assert nodes[scale["statusReplicasPath"]]["type"] == "integer"
    assert nodes[scale["labelSelectorPath"]]["type"] == "string"
