"""Each route's identity Secret (meshnet.pki): issued when the route has none, issued
again when a leaf nears its expiry or no longer names every replica's addresses, before
the reconcile plans (the plan mounts it and carries which issue it is)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from meshnet import pki
from meshnet.api import labels
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.operator.kube import KubeClient, path
from meshnet.reconcile.route import ObservedRoute
from meshnet.reconcile.route.identity import (
    IssuedIdentity,
    identity_secret_name,
    stage_hosts,
    stage_server_name,
)
from meshnet.reconcile.route.podspec import RouteRef, owner_reference
from meshnet.timestamps import rfc3339
from meshnet.tracker.collect import StageTls

ISSUED_ANNOTATION = f"{labels.ROUTE.split('/')[0]}/identity-issued"
IDENTITY_LABEL = f"{labels.ROUTE.split('/')[0]}/identity"


def secret_labels(route: str) -> dict[str, str]:
    return {labels.MANAGED_BY: labels.OPERATOR_NAME, labels.ROUTE: route,
            IDENTITY_LABEL: "route"}


def indexed(body: Mapping[str, Any]) -> tuple[dict[str, bytes], str]:
    """What the operator keeps of an identity Secret: its files and its issue."""
    data = {k: base64.b64decode(v) for k, v in (body.get("data") or {}).items()}
    issued = ((body.get("metadata") or {}).get("annotations") or {}).get(ISSUED_ANNOTATION, "")
    return data, issued


Found = tuple[dict[str, bytes], str]  # an identity Secret's files and issue


def operator_tls(namespace: str, route: str, spec: ShardRouteSpec | None,
                 identity: Found | None) -> StageTls | None:
    """How the operator calls the route's stages (by pod IP): over mTLS with its own
    identity where the route runs on the identities it issued; None where the route runs
    plaintext (or on the user's Secret, whose client certificate the operator lacks)."""
    if spec is None or identity is None \
            or (spec.tls is not None and spec.tls.effective_mode() != "Operator"):
        return None
    data = identity[0]
    return StageTls(data[pki.CA_CERT], data[pki.cert_key(pki.OPERATOR)],
                    data[pki.key_key(pki.OPERATOR)], stage_server_name(route, namespace))


async def ensure_identity(client: KubeClient, route: ObservedRoute, found: Found | None,
                          now: datetime) -> tuple[IssuedIdentity, Found]:
    """The route's identity Secret, as `found` (the index's) or as issued now."""
    ref = RouteRef(route.name, route.namespace, route.uid)
    name = identity_secret_name(route.name)
    replicas = route.spec.replicas if route.spec is not None else 1
    subject = pki.Subject(route.namespace, route.name,
                          stage_hosts(route.name, route.namespace, replicas))
    url = path("v1", "secrets", route.namespace, name)
    if found is not None and found[1] and pki.renewal_due(found[0], subject, now) is None:
        return IssuedIdentity(name, found[1]), found
    if found is None:  # not in the index yet: made by a reconcile the watch has not told of
        existing = await client.get(url)
        if existing is not None:
            found = indexed(existing)
            if found[1] and pki.renewal_due(found[0], subject, now) is None:
                return IssuedIdentity(name, found[1]), found
    issued = rfc3339(now)
    data = pki.issue(subject, now, found[0] if found else None)
    body = _secret(ref, name, data, issued)
    if found is None:
        created = await client.create(path("v1", "secrets", route.namespace), body)
        if created is None:  # another pass made it meanwhile: take that one
            current = await client.get(url)
            assert current is not None
            found = indexed(current)
            return IssuedIdentity(name, found[1]), found
    else:
        await client.patch(url, {"metadata": {"annotations": body["metadata"]["annotations"]},
                                 "data": body["data"]})
    return IssuedIdentity(name, issued), (data, issued)


def _secret(ref: RouteRef, name: str, data: Mapping[str, bytes], issued: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": ref.namespace,
                     "labels": secret_labels(ref.name),
                     "annotations": {ISSUED_ANNOTATION: issued},
                     "ownerReferences": [owner_reference(ref)]},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
