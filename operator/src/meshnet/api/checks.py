"""The operator's own checks of a ShardRoute: the CEL rules again (so an API server
without CEL cannot slip an invalid route past it) plus what needs the artifact."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.api.shardroute import DEFAULT_GPU_RESOURCES, ShardRouteSpec


@dataclass(frozen=True)
class Problem:
    """One validation failure at a field path such as spec.stages[1].layers."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def route_problems(spec: ShardRouteSpec, block_count: int | None) -> list[Problem]:
    """Every reason the stages cannot be served; empty when they can."""
    problems: list[Problem] = []
    if spec.recipe.mtp != "Disabled":
        problems.append(Problem("spec.recipe.mtp", "mtp is reserved and must be Disabled"))
    seen: set[str] = set()
    previous_end: int | None = None
    for i, stage in enumerate(spec.stages):
        path, layers = f"spec.stages[{i}]", stage.layers
        if stage.name in seen:
            problems.append(Problem(f"{path}.name", f"stage name {stage.name!r} is not unique"))
        seen.add(stage.name)
        if layers.begin >= layers.end:
            problems.append(Problem(f"{path}.layers", f"range {layers} is empty"))
        if previous_end is not None and layers.begin != previous_end:
            problems.append(Problem(
                f"{path}.layers", f"stage {stage.name!r} begins at layer {layers.begin}"
                f" but the previous stage ends at {previous_end} (stages must be contiguous)",
            ))
        resources = stage.resources
        if resources.gpus and not resources.gpu_resource_name \
                and spec.recipe.lane not in DEFAULT_GPU_RESOURCES:
            problems.append(Problem(
                f"{path}.resources", f"stage {stage.name!r} requests GPUs, but lane"
                f" {spec.recipe.lane!r} has no default GPU resource: set gpuResourceName",
            ))
        if block_count is not None and layers.end > block_count:
            problems.append(Problem(
                f"{path}.layers", f"stage {stage.name!r} ends at layer {layers.end}"
                f" but the artifact has only {block_count} blocks",
            ))
        previous_end = layers.end
    return problems
