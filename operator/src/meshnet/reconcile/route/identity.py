"""A route's link security, resolved from spec.tls (pure): which Secret each role's TLS
files come from and how a pod mounts them, and the route key's mount.

By default (spec.tls absent or mode Operator) the operator issues the route's identities
(meshnet.pki) into the Secret `<route>-identity`, which it owns: ca.crt and ca.key, a leaf
per role (stage.crt/key, gateway.crt/key, certify.crt/key) and route.key. A pod mounts
only its own role's files, renamed to the tls.crt, tls.key and ca.crt the commands read,
and never ca.key. The route key is mounted from the same Secret in every mode."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from meshnet.api.shardroute import RouteTls
from meshnet.reconcile.naming import child_name, service_name

# Where pods find the route key (the route's shared secret for Ring and session RPCs).
ROUTE_KEY_DIR = "/etc/meshnet/route-key"
ROUTE_KEY_FILE = "route.key"
ROUTE_KEY_PATH = PurePosixPath(ROUTE_KEY_DIR, ROUTE_KEY_FILE)
ROUTE_KEY_VOLUME = "route-key"
TLS_VOLUME = "tls"

STAGE, GATEWAY, CERTIFY = "stage", "gateway", "certify"  # as meshnet.pki names the roles
# The stage certificate names the Services of this many replicas at a time; a route
# scaled past them gets its leaves issued again for the next block.
REPLICA_BLOCK = 16


def stage_server_name(route: str, namespace: str) -> str:
    """The name every stage certificate the operator issues carries beside its DNS names
    (meshnet.pki.Subject.common_name): what callers that dial pod IPs check it against."""
    return f"{STAGE}.{route}.{namespace}"


def identity_secret_name(route: str) -> str:
    return child_name(route, "identity")


def stage_hosts(route: str, namespace: str, replicas: int) -> tuple[str, ...]:
    """The DNS names the stage certificate carries: every stage pod of the first replicas
    (a whole number of REPLICA_BLOCKs covering `replicas`) by its headless Service."""
    covered = max(1, -(-replicas // REPLICA_BLOCK)) * REPLICA_BLOCK
    return tuple(f"*.{service_name(route, r)}.{namespace}.svc" for r in range(covered))


@dataclass(frozen=True)
class IssuedIdentity:
    """The route's identity Secret as the operator found or made it: its name and which
    issue of the leaves it holds (a renewal changes it, and so rolls the pods that read
    them)."""

    secret_name: str
    issued: str  # the leaves' issue time, RFC 3339


@dataclass(frozen=True)
class LinkTls:
    """TLS of a route's links as its pods render it: the Secret the files come from,
    whether stages require client certificates, and for the operator's identity Secret
    (`issued` set) which issue of the leaves it is."""

    secret_name: str
    require_client_cert: bool
    issued: str | None = None  # None: the user's Secret, mounted whole as before


def link_tls(tls: RouteTls | None, identity: IssuedIdentity | None) -> LinkTls | None:
    """The route's links' TLS (None: plaintext). Mode Operator needs the `identity` the
    operator issued; a backend that issues none (`meshnet up`, on loopback) passes None and
    runs plaintext."""
    mode = tls.effective_mode() if tls is not None else "Operator"
    if mode == "Disabled":
        return None
    if mode == "Secret":
        assert tls is not None and tls.secret_name is not None  # the CRD requires it
        return LinkTls(tls.secret_name, tls.require_client_cert)
    if identity is None:
        return None
    return LinkTls(identity.secret_name, True, identity.issued)


def tls_volume(tls: LinkTls, role: str) -> dict[str, Any]:
    """The volume of `role`'s TLS files: ca.crt, and its own tls.crt and tls.key."""
    secret: dict[str, Any] = {"secretName": tls.secret_name, "defaultMode": 0o440}
    if tls.issued is not None:
        secret["items"] = [{"key": "ca.crt", "path": "ca.crt"},
                           {"key": f"{role}.crt", "path": "tls.crt"},
                           {"key": f"{role}.key", "path": "tls.key"}]
    return {"name": TLS_VOLUME, "secret": secret}


def route_key_volume(secret_name: str) -> dict[str, Any]:
    return {"name": ROUTE_KEY_VOLUME, "secret": {
        "secretName": secret_name, "defaultMode": 0o440,
        "items": [{"key": ROUTE_KEY_FILE, "path": ROUTE_KEY_FILE}]}}


ROUTE_KEY_MOUNT: Mapping[str, Any] = {"name": ROUTE_KEY_VOLUME, "mountPath": ROUTE_KEY_DIR,
                                      "readOnly": True}


def identity_env(tls: LinkTls | None) -> list[dict[str, str]]:
    """An environment entry that carries the issue of the leaves into the pod's template:
    a renewal changes the template, so the pods are replaced onto the new files (a
    process reads its certificate once, at start). Nothing reads it."""
    if tls is None or tls.issued is None:
        return []
    return [{"name": "MESHNET_IDENTITY_ISSUED", "value": tls.issued}]
