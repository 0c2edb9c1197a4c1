"""Deterministic names of a route's children (the same inputs always give the same name)."""

from __future__ import annotations

import hashlib

DNS_LABEL = 63


def child_name(*parts: str, limit: int = DNS_LABEL) -> str:
    """Join parts with '-'; names over the limit keep a prefix plus a short hash of the whole."""
    name = "-".join(parts)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def _replica_suffix(replica: int) -> tuple[str, ...]:
    """Replica 0 keeps the names a route had before replicas; replica r > 0 adds `r<r>`
    last, after `e<epoch>` (pods) or `workers` (Services): a replica-0 name ends in one of
    those, so no other stage of the route (or, for a Service, no other route) has it."""
    return (f"r{replica}",) if replica else ()


def pod_name(route: str, stage: str, epoch: int, replica: int = 0) -> str:
    return child_name(route, stage, f"e{epoch}", *_replica_suffix(replica))


def service_name(route: str, replica: int = 0) -> str:
    """The headless Service that gives each stage pod of one replica a stable DNS name."""
    return child_name(route, "workers", *_replica_suffix(replica))


def stage_host(stage: str, epoch: int) -> str:
    """A stage pod's hostname: the stage and its epoch, so that a new epoch's pipeline
    runs beside the old one in the same replica and the two never share an address."""
    return child_name(stage, f"e{epoch}")


def endpoint(stage: str, route: str, namespace: str, port: int, replica: int,
             epoch: int) -> str:
    """host:port of a stage of a replica at an epoch; the pod's hostname is
    `stage_host`, its subdomain the replica's Service."""
    return f"{stage_host(stage, epoch)}.{service_name(route, replica)}.{namespace}.svc:{port}"


def gateway_name(route: str) -> str:
    """The gateway's Deployment and Service."""
    return child_name(route, "gateway")
