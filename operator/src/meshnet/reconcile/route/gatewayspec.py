"""Pure builders of a route's gateway: a Deployment running `meshnet serve` against the
stages of the pipeline serving each replica, by their DNS names (which carry the epoch),
and a ClusterIP Service in front of it. A scale, or a replica switched to a new epoch's
pipeline, changes the gateway's arguments, so the Deployment rolls: the new gateway pod
takes new sessions once it is Ready, and the old one finishes its running sessions (on
the old pipelines, which drain as long) before it exits. Nothing here talks to the
cluster."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshnet.api import labels
from meshnet.api.shardroute import Gateway, RouteTls, Speculation, Stage
from meshnet.reconcile.children import CONTAINER_SECURITY, POD_SECURITY, template_hash
from meshnet.reconcile.naming import endpoint, gateway_name
from meshnet.reconcile.route.podspec import (
    TLS_DIR,
    RouteRef,
    WorkerConfig,
    owned_service,
    owner_reference,
)

GRACE_MARGIN_SECONDS = 10  # beyond the drain: the gateway's own shutdown after it
DEFAULT_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
DEFAULT_LIMITS = {"memory": "1Gi"}


def gateway_labels(route: RouteRef) -> dict[str, str]:
    return {"app.kubernetes.io/name": "meshnet-gateway",
            "app.kubernetes.io/instance": route.name,
            labels.MANAGED_BY: labels.OPERATOR_NAME, labels.GATEWAY: route.name}


def gateway_url(route: RouteRef, config: WorkerConfig) -> str:
    """The OpenAI base URL of the route inside the cluster (status.endpoint)."""
    return f"http://{gateway_name(route.name)}.{route.namespace}.svc:{config.gateway_port}/v1"


def speculation_args(speculation: Speculation) -> list[str]:
    """`meshnet serve`'s flags for the recipe's speculation, so that every request
    speculates as the recipe allows (0 drafts while it is disabled)."""
    drafter = speculation.stage_drafter()
    return ["--speculate", str(speculation.loop_drafts()),
            "--windows", str(speculation.loop_windows()),
            *(["--drafter", drafter] if drafter else [])]


def replica_args(route: RouteRef, stages: list[Stage], epochs: Sequence[int],
                 config: WorkerConfig) -> list[str]:
    """Where the gateway finds the replicas, `epochs[r]` the epoch of the pipeline serving
    replica r: one replica as `--stage` per stage, several as `--replica` per replica, none
    as `--scaled-to-zero`."""
    def address(stage: Stage, replica: int) -> str:
        return endpoint(stage.name, route.name, route.namespace, config.grpc_port, replica,
                        epochs[replica])

    if not epochs:
        return ["--scaled-to-zero"]
    if len(epochs) == 1:
        return [arg for stage in stages for arg in ("--stage", address(stage, 0))]
    return [arg for replica in range(len(epochs))
            for arg in ("--replica", ",".join(address(stage, replica) for stage in stages))]


def gateway_args(route: RouteRef, stages: list[Stage], gateway: Gateway, tls: RouteTls | None,
                 speculation: Speculation, config: WorkerConfig, epochs: Sequence[int],
                 drain_seconds: int = 0) -> list[str]:
    args = ["serve", "--model", route.name, "--listen", f"0.0.0.0:{config.gateway_port}",
            "--max-waiting", str(gateway.max_waiting), *speculation_args(speculation),
            "--drain-seconds", str(drain_seconds),
            *replica_args(route, stages, epochs, config)]
    if tls is not None:
        args += ["--tls-ca", f"{TLS_DIR}/ca.crt"]
        if tls.require_client_cert:  # the stages' own pair: the gateway is one of the route's
            args += ["--tls-cert", f"{TLS_DIR}/tls.crt", "--tls-key", f"{TLS_DIR}/tls.key"]
    return args


def _http_probe(path: str, period: int, failures: int, port: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 3}


def gateway_deployment(route: RouteRef, stages: list[Stage], gateway: Gateway,
                       tls: RouteTls | None, speculation: Speculation,
                       config: WorkerConfig, epochs: Sequence[int],
                       drain_seconds: int = 0) -> dict[str, Any]:
    assert config.gateway_image is not None
    pod_labels = gateway_labels(route)
    container: dict[str, Any] = {
        "name": "gateway",
        "image": config.gateway_image,
        "imagePullPolicy": config.image_pull_policy,
        "args": gateway_args(route, stages, gateway, tls, speculation, config, epochs,
                             drain_seconds),
        "ports": [{"name": "http", "containerPort": config.gateway_port, "protocol": "TCP"}],
        "resources": {
            "requests": {**DEFAULT_REQUESTS,
                         **{k: str(v) for k, v in gateway.resources.requests.items()}},
            "limits": {**DEFAULT_LIMITS,
                       **{k: str(v) for k, v in gateway.resources.limits.items()}},
        },
        # ready while the route is servable: a Service never sends requests to a gateway
        # whose stages do not all answer
        "readinessProbe": _http_probe("/ready", 5, 2, config.gateway_port),
        "livenessProbe": _http_probe("/health", 10, 6, config.gateway_port),
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    if tls is not None:
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": tls.secret_name,
                                                  "defaultMode": 0o440}})
    spec: dict[str, Any] = {
        "replicas": gateway.replicas,
        "selector": {"matchLabels": {labels.GATEWAY: route.name}},
        # a new gateway pod is Ready before an old one stops taking sessions
        "strategy": {"type": "RollingUpdate",
                     "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {
            "metadata": {"labels": pod_labels},
            "spec": {
                "automountServiceAccountToken": False,
                # an old gateway pod finishes its running sessions (`--drain-seconds`)
                "terminationGracePeriodSeconds": drain_seconds + GRACE_MARGIN_SECONDS,
                "enableServiceLinks": False,
                "securityContext": dict(POD_SECURITY),
                "containers": [container],
                "volumes": volumes,
            },
        },
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": gateway_name(route.name), "namespace": route.namespace,
                     "labels": {**pod_labels, labels.TEMPLATE: template_hash(spec)},
                     "ownerReferences": [owner_reference(route)]},
        "spec": spec,
    }


def gateway_service(route: RouteRef, config: WorkerConfig) -> dict[str, Any]:
    spec = {
        "type": "ClusterIP",
        "selector": {labels.GATEWAY: route.name},
        "ports": [{"name": "http", "port": config.gateway_port, "targetPort": "http"}],
    }
    return owned_service(route, gateway_name(route.name), gateway_labels(route), spec)
