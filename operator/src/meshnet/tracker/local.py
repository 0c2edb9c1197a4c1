"""The report inputs of a route run by `meshnet up`: its registry entry, its route file
and the certificate kept on this machine for its lane."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshnet.api.certification import CertifiedLane
from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.api.tracker import CertificationState
from meshnet.certify import lane as lanes
from meshnet.certify import store
from meshnet.certify.hardware import local_gpu_product
from meshnet.local.manifests import load_route_file
from meshnet.local.registry import lookup
from meshnet.tracker.inputs import RouteView, StageView


@dataclass(frozen=True)
class LocalRoute:
    entry: dict[str, Any]
    namespace: str
    spec: ShardRouteSpec
    block_count: int | None
    lane: CertifiedLane | None
    architecture: str | None = None

    @property
    def endpoints(self) -> list[str]:
        return [str(s["endpoint"]) for s in self.entry["stages"]]

    @property
    def model(self) -> Path:
        return Path(self.entry["model"])


def local_route(name: str) -> LocalRoute:
    """The route `meshnet up` publishes as `name` (RouteNotFound when none runs)."""
    entry = lookup(name)
    route_file = load_route_file(Path(entry["file"]))
    spec = ShardRouteSpec.model_validate(route_file.route["spec"])
    artifact = ModelArtifactSpec.model_validate(route_file.artifact["spec"])
    manifest, recipe = entry.get("manifestDigest"), entry.get("recipeDigest")
    lane = CertifiedLane(backend=spec.recipe.lane,
                         gpu_product=local_gpu_product(spec.recipe.lane),
                         manifest_digest=manifest, recipe_digest=recipe,
                         **lanes.promises(spec.recipe)) if manifest and recipe else None
    block_count = artifact.expectations.block_count
    return LocalRoute(entry, str(route_file.route["metadata"].get("namespace", "local")),
                      spec, block_count, lane, artifact.expectations.architecture)


def views(route: LocalRoute) -> tuple[RouteView, list[StageView]]:
    entry = route.entry
    view = RouteView(
        name=str(entry["name"]), namespace=route.namespace,
        route_id=f"{route.namespace}/{entry['name']}", recipe=route.spec.recipe,
        epoch=int(entry.get("epoch") or 0), route_digest=entry.get("routeDigest"),
        manifest_digest=entry.get("manifestDigest"), recipe_digest=entry.get("recipeDigest"),
        architecture=route.architecture, block_count=route.block_count,
        ready=True,  # published only once Ready
        endpoint=entry.get("gateway"))
    running = {s["name"]: s for s in entry["stages"]}
    stages = []
    for stage in route.spec.stages:
        found = running.get(stage.name)
        stages.append(StageView(
            name=stage.name, begin=stage.layers.begin, end=stage.layers.end,
            endpoint=str(found["endpoint"]) if found else None, ready=found is not None,
            restarts=int(found.get("restarts", 0)) if found else 0,
            started_at=found.get("startedAt") if found else None,
            problem="" if found else f"stage {stage.name} has no worker at this epoch"))
    return view, stages


def certification(route: LocalRoute) -> CertificationState:
    return lanes.state(route.lane, store.load(route.lane) if route.lane else None)
