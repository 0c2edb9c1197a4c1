"""Pure builders of a Measured route's probe children: the token Secret, one probe-agent
pod per node (`meshnet links serve`) and the measuring Job (`meshnet links place`), whose
measured links come back as its container's termination message (docs/placement.md)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshnet.api import labels
from meshnet.api.common import GROUP
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.reconcile.children import CONTAINER_SECURITY, POD_SECURITY
from meshnet.reconcile.naming import child_name
from meshnet.reconcile.route.linkcompression import BREAK_EVEN_BITS_PER_SECOND
from meshnet.reconcile.route.podspec import RouteRef, owner_reference

PLACEMENT_ROUTE = f"{GROUP}/placement-route"  # on agents, Job and token (not stage pods)
NODES_KEY = f"{GROUP}/placement-nodes"  # on the Job: the node set it measures
NODE = f"{GROUP}/placement-node"  # annotation on an agent: its node
TOKEN_KEY = "token"
TOKEN_DIR = "/etc/meshnet/probe"
TERMINATION_LOG = "/dev/termination-log"
ROW_BYTES = 4 * 4096 * 4  # a DeepSeek V4 boundary row in f32; the artifact does not say
NODE_FIELD = "metadata.name"


@dataclass(frozen=True)
class PlacementConfig:
    """Operator-wide inputs of measuring (from settings)."""

    image: str | None = None  # the operator's image (it has `meshnet`); None: no measuring
    port: int = 7070
    interval_seconds: float = 3600.0  # a node set's links are measured again after this
    retry_seconds: float = 300.0  # after a failed measurement
    rounds: int = 5
    probe_bytes: str = "8M"
    deadline_seconds: int = 600
    pull_policy: str = "IfNotPresent"
    # spec.boundaryCompression Auto packs a leg measured slower than this
    compression_break_even_bits_per_second: float = BREAK_EVEN_BITS_PER_SECOND


def on_node(node: str) -> dict[str, Any]:
    """A required node affinity to `node` by name (as a DaemonSet's pods are pinned)."""
    term = {"matchFields": [{"key": NODE_FIELD, "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}


def token_name(route: str) -> str:
    return child_name(route, "probe-token")


def _tags(route: RouteRef) -> dict[str, str]:
    return {labels.MANAGED_BY: labels.OPERATOR_NAME, PLACEMENT_ROUTE: route.name}


def token_secret(route: RouteRef, token: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": token_name(route.name), "namespace": route.namespace,
                         "labels": _tags(route), "ownerReferences": [owner_reference(route)]},
            "stringData": {TOKEN_KEY: token}}


def _token_volume(secret: str) -> dict[str, Any]:
    return {"name": "probe-token", "secret": {"secretName": secret, "defaultMode": 0o440}}


def _container(config: PlacementConfig, name: str, args: list[str]) -> dict[str, Any]:
    return {"name": name, "image": config.image, "command": ["meshnet"], "args": args,
            "imagePullPolicy": config.pull_policy, "securityContext": CONTAINER_SECURITY,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                          "limits": {"memory": "256Mi"}},
            "volumeMounts": [{"name": "probe-token", "mountPath": TOKEN_DIR,
                              "readOnly": True}]}


def agent_name(route: str, node: str) -> str:
    return child_name(route, "probe", hashlib.sha256(node.encode()).hexdigest()[:10])


def agent_pod(route: RouteRef, node: str, config: PlacementConfig,
              secret: str) -> dict[str, Any]:
    """`meshnet links serve` on `node` (pinned by name, tolerating its taints: a stage runs
    there), answering only holders of the route's probe token."""
    container = _container(config, "probe", [
        "links", "serve", "--listen", f"0.0.0.0:{config.port}",
        "--token-file", f"{TOKEN_DIR}/{TOKEN_KEY}"])
    container["ports"] = [{"name": "probe", "containerPort": config.port}]
    container["readinessProbe"] = {"tcpSocket": {"port": config.port}, "periodSeconds": 2}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": agent_name(route.name, node), "namespace": route.namespace,
                     "labels": _tags(route), "annotations": {NODE: node},
                     "ownerReferences": [owner_reference(route)]},
        "spec": {"restartPolicy": "Always", "automountServiceAccountToken": False,
                 "enableServiceLinks": False, "securityContext": POD_SECURITY,
                 "affinity": on_node(node),
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [container], "volumes": [_token_volume(secret)]},
    }


def measuring_job(route: RouteRef, spec: ShardRouteSpec, agents: Mapping[str, str],
                  config: PlacementConfig, key: str, secret: str) -> dict[str, Any]:
    """`meshnet links place` against the agents (node -> pod IP); the links come back as
    the container's termination message."""
    topology = "chain" if spec.recipe.topology == "chain" else "ring"
    args = ["links", "place", *(f"{node}={ip}:{config.port}" for node, ip in sorted(
        agents.items())), "--topology", topology, "--row-bytes", str(ROW_BYTES),
        "--rounds", str(config.rounds), "--probe-bytes", config.probe_bytes,
        "--token-file", f"{TOKEN_DIR}/{TOKEN_KEY}", "--termination-log", TERMINATION_LOG,
        "--json"]
    container = _container(config, "measure", args)
    container["terminationMessagePath"] = TERMINATION_LOG
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    tags = {**_tags(route), NODES_KEY: key}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": child_name(route.name, "placement", key[:10]),
                     "namespace": route.namespace, "labels": tags,
                     "ownerReferences": [owner_reference(route)]},
        "spec": {"backoffLimit": 0, "activeDeadlineSeconds": config.deadline_seconds,
                 "ttlSecondsAfterFinished": 3600,
                 "template": {"metadata": {"labels": tags}, "spec": {
                     "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "enableServiceLinks": False, "securityContext": POD_SECURITY,
                     "containers": [container], "volumes": [_token_volume(secret)]}}},
    }
