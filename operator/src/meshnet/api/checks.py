"""The operator's own checks of a ShardRoute: the CEL rules again (so an API server
without CEL cannot slip an invalid route past it) plus what needs the artifact."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.modelartifact import GgufDrafter
from meshnet.api.shardroute import (
    DEFAULT_GPU_RESOURCES,
    MAX_STEP_TOKENS,
    REMOVED_MTP,
    ShardRouteSpec,
)


@dataclass(frozen=True)
class Problem:
    """One validation failure at a field path such as spec.stages[1].layers; `reason` is
    the condition reason it gives the route."""

    path: str
    message: str
    reason: str = "InvalidSpec"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def route_problems(spec: ShardRouteSpec, block_count: int | None) -> list[Problem]:
    """Every reason the stages cannot be served; empty when they can.

    `block_count` is the number of layers the stages must cover together (the artifact's
    main layers), None while it is unknown.
    """
    problems: list[Problem] = []
    first = spec.stages[0]
    if first.layers.begin != 0:
        problems.append(Problem(
            "spec.stages[0].layers", f"stage {first.name!r} begins at layer {first.layers.begin}:"
            f" {_layers(0, first.layers.begin)} would never run (the first stage must begin at 0)",
        ))
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
    problems += removed_field_problems(spec)
    block = spec.recipe.prefix_cache.block
    if block is not None and block > MAX_STEP_TOKENS:
        problems.append(Problem(
            "spec.recipe.prefixCache.block", f"block {block} is more than the {MAX_STEP_TOKENS}"
            " tokens a stage takes in one step: a block is prefilled as one step, so every"
            f" prompt over {MAX_STEP_TOKENS} tokens would be refused (STEP_TOO_LARGE); at most"
            f" {MAX_STEP_TOKENS}", "PrefixBlockTooLarge",
        ))
    last = spec.stages[-1]
    if block_count is not None and last.layers.end < block_count:
        problems.append(Problem(
            f"spec.stages[{len(spec.stages) - 1}].layers", f"stage {last.name!r} ends at layer"
            f" {last.layers.end} but the artifact has {block_count} blocks:"
            f" {_layers(last.layers.end, block_count)} would never run",
        ))
    return problems


def removed_field_problems(spec: ShardRouteSpec) -> list[Problem]:
    """A removed field that keeps a value other than the one meaning kept: recipe.mtp's
    only accepted value was Disabled, and no MTP is not speculation.mode MTP."""
    mtp = spec.recipe.mtp
    if mtp is None:
        return []
    if mtp != "Disabled":
        return [Problem("spec.recipe.mtp", f"{REMOVED_MTP}; mtp: {mtp} was never accepted"
                        " and is refused: set recipe.speculation.mode instead", "RemovedField")]
    if spec.recipe.speculation.stage_drafter() is DrafterKind.MTP:
        return [Problem("spec.recipe.mtp", f"{REMOVED_MTP}; mtp: Disabled contradicts"
                        " speculation.mode MTP: remove mtp", "RemovedField")]
    return []


def _layers(begin: int, end: int) -> str:
    """'layer 29', or 'layers [20, 30)' for several."""
    return f"layer {begin}" if end - begin == 1 else f"layers [{begin}, {end})"


def drafter_problems(spec: ShardRouteSpec, facts_known: bool,
                     drafter: GgufDrafter | None) -> list[Problem]:
    """Why the route cannot draft as its recipe says with the artifact's drafter (`drafter`,
    from its headers once `facts_known`): none of that kind, or a last stage that does not
    own every layer the drafter reads (only the stage computing those layers has their
    hidden states)."""
    kind = spec.recipe.speculation.stage_drafter()
    if kind is None or not facts_known:
        return []
    if drafter is None or DrafterKind.from_api(drafter.kind) is not kind:
        carries = f"a {drafter.kind} drafter" if drafter else "no drafter"
        wanted = ("MTP blocks in its GGUF" if kind is DrafterKind.MTP
                  else "a DSpark drafter GGUF (a file of role Drafter)")
        return [Problem("spec.recipe.speculation.mode",
                        f"mode {kind.api_name} drafts with {wanted}; the artifact carries"
                        f" {carries}",
                        "DrafterMissing")]
    last = spec.stages[-1]
    begin, end = last.layers.begin, last.layers.end
    outside = [layer for layer in drafter.target_layers if not begin <= layer < end]
    if not outside:
        return []
    reads = ", ".join(str(layer) for layer in drafter.target_layers)
    need = min(drafter.target_layers)
    return [Problem(f"spec.stages[{len(spec.stages) - 1}].layers",
                    f"the {kind.api_name} drafter reads the outputs of layers {reads}, which"
                    f" only the stage computing them has; the last stage {last.name!r} owns"
                    f" {begin}:{end}: it must begin at layer {need} or earlier",
                    "DrafterLayersSplit")]
