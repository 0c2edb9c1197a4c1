"""The scale subresource of a custom resource as the API server serves it: an
autoscaling/v1 Scale read from, and written to, the paths its CRD declares (kmock knows
no subresources: the emulator asks this module)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshnet.api.crd import crd_documents

SCALE_API_VERSION = "autoscaling/v1"


def scale_paths() -> dict[str, dict[str, str]]:
    """plural -> the `scale` subresource of its generated CRD, for those that have one."""
    found = {}
    for crd in crd_documents().values():
        scale = crd["spec"]["versions"][0].get("subresources", {}).get("scale")
        if scale is not None:
            found[crd["spec"]["names"]["plural"]] = scale
    return found


def _keys(path: str) -> list[str]:
    return path.lstrip(".").split(".")


def _read(obj: Mapping[str, Any], path: str) -> Any:
    node: Any = obj
    for key in _keys(path):
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def _schema_default(plural: str, path: str) -> Any:
    """The CRD schema's default at `path`: what the API server would have filled in."""
    crd = next(d for d in crd_documents().values() if d["spec"]["names"]["plural"] == plural)
    node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for key in _keys(path):
        node = (node.get("properties") or {}).get(key) or {}
    return node.get("default")


def scale_of(plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The Scale of `obj` (a resource of `plural`) as GET .../scale answers it."""
    paths = scale_paths()[plural]
    meta = obj.get("metadata") or {}
    desired = _read(obj, paths["specReplicasPath"])
    if desired is None:
        desired = _schema_default(plural, paths["specReplicasPath"])
    status: dict[str, Any] = {"replicas": _read(obj, paths["statusReplicasPath"]) or 0}
    selector = _read(obj, paths["labelSelectorPath"]) if "labelSelectorPath" in paths else None
    if selector:
        status["selector"] = selector
    return {"apiVersion": SCALE_API_VERSION, "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                              "creationTimestamp") if k in meta},
            "spec": {"replicas": desired or 0}, "status": status}


def object_patch(plural: str, scale_patch: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch of the Scale's spec.replicas, as a merge patch of the object itself
    (the only field a scale write may change)."""
    replicas = (scale_patch.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"spec.replicas must be a non-negative integer, not {replicas!r}")
    patch: dict[str, Any] = {}
    node = patch
    *parents, last = _keys(scale_paths()[plural]["specReplicasPath"])
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = replicas
    return patch
