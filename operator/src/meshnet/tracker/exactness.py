"""What a route's stages compute exactly, for its status (status.exactness): each worker
measures at start the widest step it computes as one-row steps and whether sessions' rows
in a shared step compute as alone (GetInfo), and the route promises no more (pure: no I/O).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshnet.api.shardroute import Recipe, RouteExactness
from meshnet.tracker.inputs import StageSample, StageView, WorkerInfo


def route_exactness(recipe: Recipe, stages: Sequence[StageView],
                    samples: Mapping[str, StageSample]) -> dict[str, Any] | None:
    """`status.exactness` as observed; None while no stage answered GetInfo."""
    infos = {stage.name: sample.info for stage in stages
             if (sample := samples.get(stage.name)) is not None and sample.info is not None}
    if not infos:
        return None
    throughput = recipe.batching == "Throughput"
    said: list[str] = []
    if throughput:
        said.append("recipe.batching Throughput: stages batch sessions as upstream does, so a"
                    " session's tokens may depend on the load")
    complete = len(infos) == len(stages)  # the route-wide figures once every stage answered
    alone = sorted(name for name, info in infos.items() if not info.exact_batching)
    if alone and not throughput:
        said.append(f"stage {', '.join(alone)}: sessions' rows do not compute as alone in a"
                    " shared step there, so each session steps alone (tokens independent of"
                    " the load, less throughput under it)")
    limit = _speculation_limit(recipe, infos)
    if limit:
        said.append(limit)
    found = RouteExactness(
        batching=recipe.batching, load_dependent=throughput,
        exact_step_rows=min(info.exact_step_rows for info in infos.values()) if complete
        else None,
        exact_batching=all(info.exact_batching for info in infos.values()) if complete
        else None,
        speculation_limit="NotExact" if limit else None,
        message="; ".join(said) or (
            "every stage computes the route's steps exactly and lets sessions share them:"
            " tokens do not depend on the load, speculation changes none"))
    return found.model_dump(mode="json", by_alias=True, exclude_none=True)


def _speculation_limit(recipe: Recipe, infos: Mapping[str, WorkerInfo]) -> str:
    """Why the route speculates less than its recipe asks ("" when it does not)."""
    speculation = recipe.speculation
    if not speculation.enabled:
        return ""
    name, narrowest = min(infos.items(), key=lambda item: item[1].exact_step_rows)
    rows = narrowest.exact_step_rows
    if rows >= speculation.max_drafts + 1:
        return ""
    what = (f"stage {name} measured exact steps of at most {rows} rows, a verify window of"
            f" maxDrafts {speculation.max_drafts} is {speculation.max_drafts + 1}")
    if rows <= 1:
        return f"decodes plainly, no speculation: {what}"
    return f"speculates with at most {rows - 1} drafts: {what}"
