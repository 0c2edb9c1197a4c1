"""Read the ModelArtifact and the ShardRoute of a local route file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from meshnet.api.common import API_VERSION
from meshnet.errors import MeshnetError


class RouteFileError(MeshnetError):
    """The route file cannot be read, lacks one of its two resources, or holds a
    ShardRoute that cannot be served."""


@dataclass(frozen=True)
class RouteFile:
    path: Path
    artifact: dict[str, Any]
    route: dict[str, Any]

    @property
    def route_name(self) -> str:
        return str(self.route["metadata"]["name"])


def load_route_file(path: Path) -> RouteFile:
    """Exactly one ModelArtifact and one ShardRoute (referring to it) from a YAML file."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RouteFileError(f"cannot read {path}: {exc}") from exc
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in documents:
        if not isinstance(doc, dict) or doc.get("apiVersion") != API_VERSION:
            raise RouteFileError(f"{path}: every document must be a {API_VERSION} resource")
        by_kind.setdefault(str(doc.get("kind")), []).append(doc)
    artifacts, routes = by_kind.get("ModelArtifact", []), by_kind.get("ShardRoute", [])
    if len(artifacts) != 1 or len(routes) != 1:
        raise RouteFileError(
            f"{path}: needs exactly one ModelArtifact and one ShardRoute "
            f"(found {len(artifacts)} and {len(routes)})"
        )
    artifact, route = artifacts[0], routes[0]
    for doc in (artifact, route):
        meta = doc.setdefault("metadata", {})
        if not isinstance(meta, dict) or not meta.get("name"):
            raise RouteFileError(f"{path}: a {doc['kind']} has no metadata.name")
        meta.setdefault("namespace", "local")
        if not isinstance(doc.get("spec") or {}, dict):  # e.g. `spec: [1, 2]`
            raise RouteFileError(f"{path}: invalid spec: the spec of {doc['kind']} "
                                 f"{meta['name']} is a {type(doc['spec']).__name__}, not a mapping")
    ref = (route.get("spec") or {}).get("artifactRef")
    wanted = ref.get("name") if isinstance(ref, dict) else None
    if wanted != artifact["metadata"]["name"]:
        raise RouteFileError(
            f"{path}: ShardRoute {route['metadata']['name']} refers to ModelArtifact "
            f"{wanted!r}, but the file holds {artifact['metadata']['name']!r}"
        )
    return RouteFile(path, artifact, route)


def check_same_route(running: RouteFile, edited: RouteFile) -> None:
    """A route's name and namespace are immutable here as in a cluster: its workers, its
    gateway's model id and its registry entry carry them. RouteFileError for an edit
    that changes them."""
    def identity(route_file: RouteFile) -> str:
        meta = route_file.route["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    if identity(running) != identity(edited):
        raise RouteFileError(
            f"{edited.path}: ShardRoute {identity(running)} cannot be renamed to "
            f"{identity(edited)}: a route's name is immutable (to serve it under the new "
            "name, stop `meshnet up` and start it again)"
        )


FileVersion = tuple[int, int, int, int] | str


def file_version(path: Path) -> FileVersion:
    """What tells one save of `path` from the next (a rename-over changes the inode, a
    quick rewrite the size, a chmod the ctime), or why it cannot be read now: editors save
    by renaming a new file over it or by deleting and rewriting it, so for a moment there
    may be none."""
    try:
        info = path.stat()
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
