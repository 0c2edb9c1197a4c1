"""Pure builders of a route's gateway: a Deployment running `meshnet serve` against the
stages of the pipeline serving each replica, by their DNS names (which carry the epoch),
and a ClusterIP Service in front of it. A scale, or a replica switched to a new epoch's
pipeline, changes the gateway's arguments, so the Deployment rolls: the new gateway pod
takes new sessions once it is Ready, and the old one finishes its running sessions (on
the old pipelines, which drain as long) before it exits. Nothing here talks to the
cluster."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from meshnet.api import labels
from meshnet.api.shardroute import Gateway, Speculation, Stage
from meshnet.reconcile.children import CONTAINER_SECURITY, POD_SECURITY, template_hash
from meshnet.reconcile.naming import endpoint, gateway_name
from meshnet.reconcile.route.gateway_command import GatewayCommand, gateway_command
from meshnet.reconcile.route.identity import (
    GATEWAY,
    ROUTE_KEY_MOUNT,
    ROUTE_KEY_PATH,
    TLS_VOLUME,
    LinkTls,
    identity_env,
    route_key_volume,
    tls_volume,
)
from meshnet.reconcile.route.podspec import (
    TLS_DIR,
    RouteRef,
    WorkerConfig,
    owned_service,
    owner_reference,
)

DEFAULT_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
# spec.gateway.apiKeysSecret is mounted whole (a subPath mount would not see updates)
API_KEYS_DIR = "/etc/meshnet/api-keys"
API_KEYS_KEY = "api-keys"
DEFAULT_LIMITS = {"memory": "1Gi"}


def gateway_labels(route: RouteRef) -> dict[str, str]:
    return {"app.kubernetes.io/name": "meshnet-gateway",
            "app.kubernetes.io/instance": route.name,
            labels.MANAGED_BY: labels.OPERATOR_NAME, labels.GATEWAY: route.name}


def gateway_url(route: RouteRef, config: WorkerConfig) -> str:
    """The OpenAI base URL of the route inside the cluster (status.endpoint)."""
    return f"http://{gateway_name(route.name)}.{route.namespace}.svc:{config.gateway_port}/v1"


def pipelines(route: RouteRef, stages: list[Stage], epochs: Sequence[int],
              config: WorkerConfig) -> list[list[str]]:
    """Each replica's stage addresses in pipeline order, `epochs[r]` the epoch of the
    pipeline serving replica r (the names carry it)."""
    return [[endpoint(stage.name, route.name, route.namespace, config.grpc_port, replica, epoch)
             for stage in stages] for replica, epoch in enumerate(epochs)]


def gateway_pod_command(route: RouteRef, stages: list[Stage], gateway: Gateway,
                        tls: LinkTls | None, speculation: Speculation, config: WorkerConfig,
                        epochs: Sequence[int], drain_seconds: int = 0) -> GatewayCommand:
    """The gateway pod's `meshnet serve`: on every interface, its replicas by their DNS
    names, its TLS files where the route's Secret is mounted."""
    keys = PurePosixPath(API_KEYS_DIR, API_KEYS_KEY) if gateway.api_keys_secret else None
    return gateway_command(route.name, gateway, speculation, drain_seconds,
                           f"0.0.0.0:{config.gateway_port}",
                           pipelines=pipelines(route, stages, epochs, config), tls=tls,
                           tls_dir=PurePosixPath(TLS_DIR), api_keys=keys,
                           route_key_file=ROUTE_KEY_PATH)


def _http_probe(path: str, period: int, failures: int, port: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 3}


def gateway_deployment(route: RouteRef, stages: list[Stage], gateway: Gateway,
                       tls: LinkTls | None, speculation: Speculation,
                       config: WorkerConfig, epochs: Sequence[int],
                       drain_seconds: int = 0,
                       route_key_secret: str | None = None) -> dict[str, Any]:
    """The gateway's Deployment: with the route's TLS, its own client identity (where the
    operator issues them) and the route key from `route_key_secret`."""
    assert config.gateway_image is not None
    pod_labels = gateway_labels(route)
    command = gateway_pod_command(route, stages, gateway, tls, speculation, config, epochs,
                                  drain_seconds)
    container: dict[str, Any] = {
        "name": "gateway",
        "image": config.gateway_image,
        "imagePullPolicy": config.image_pull_policy,
        "args": command.args(),
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
        container["volumeMounts"].append({"name": TLS_VOLUME, "mountPath": TLS_DIR,
                                          "readOnly": True})
        volumes.append(tls_volume(tls, GATEWAY))
        if env := identity_env(tls):
            container["env"] = env
    if route_key_secret is not None:
        container["volumeMounts"].append(dict(ROUTE_KEY_MOUNT))
        volumes.append(route_key_volume(route_key_secret))
    if gateway.api_keys_secret:
        container["volumeMounts"].append(
            {"name": "api-keys", "mountPath": API_KEYS_DIR, "readOnly": True})
        volumes.append({"name": "api-keys", "secret": {
            "secretName": gateway.api_keys_secret, "defaultMode": 0o440,
            "items": [{"key": API_KEYS_KEY, "path": API_KEYS_KEY}]}})
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
                "terminationGracePeriodSeconds": command.grace_seconds,
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
