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


def pod_name(route: str, stage: str, epoch: int) -> str:
    return child_name(route, stage, f"e{epoch}")


def service_name(route: str) -> str:
    """The headless Service that gives every stage pod a stable DNS name."""
    return child_name(route, "workers")


def endpoint(stage: str, route: str, namespace: str, port: int) -> str:
    """host:port of a stage; the pod's hostname is the stage name, its subdomain the Service."""
    return f"{stage}.{service_name(route)}.{namespace}.svc:{port}"


def gateway_name(route: str) -> str:
    """The gateway's Deployment and Service."""
    return child_name(route, "gateway")
