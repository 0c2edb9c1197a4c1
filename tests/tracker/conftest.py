"""The loopback Tracker (a real HTTP server standing in for the external Tracker) and
builders of report inputs for the pure tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from meshnet.api.certification import Certificate, CertifiedLane, ParityResult, SpeedResult
from meshnet.api.shardroute import Recipe
from meshnet.devtools.tracker import LoopbackTracker
from meshnet.tracker.inputs import RouteView, StageSample, StageView, WorkerCapacity, WorkerInfo

TOKEN = "tracker-token-for-tests"
MANIFEST, RECIPE, ROUTE = "a" * 64, "b" * 64, "c" * 64
RANGES = ((0, 10), (10, 20), (20, 30))


@pytest.fixture
def tracker() -> Iterator[LoopbackTracker]:
    with LoopbackTracker(token=TOKEN) as receiver:
        yield receiver


def lane(**changes: Any) -> CertifiedLane:
    fields = {"backend": "cpu", "gpu_product": "none", "manifest_digest": MANIFEST,
              "recipe_digest": RECIPE, **changes}
    return CertifiedLane(**fields)


def certificate(passed: bool = True, **lane_changes: Any) -> Certificate:
    return Certificate(
        lane=lane(**lane_changes), passed=passed, certified_at="2026-11-29T12:00:00Z",
        failures=[] if passed else ["speed: 40.0 tok/s is 0.90 of the unsplit 44.0 tok/s;"
                                    " 100 is required"],
        reasons=[] if passed else ["Speed"],
        parity=ParityResult(prompts=4, decode_steps=8, max_abs_delta_logit=0.0,
                            rows_compared=36, rows_differing=0, tolerance=0.0, exact=True,
                            greedy_match=True),
        speed=SpeedResult(decode_tokens_per_second=40.0, reference_decode_tokens_per_second=44.0,
                          fraction=0.909, required_fraction=100.0 if not passed else 0.5,
                          topology="hub"),
        stages=3)


def route_view(**changes: Any) -> RouteView:
    fields = {"name": "r1", "namespace": "default", "route_id": "default/r1",
              "recipe": Recipe(context_length=2048, session_slots=4), "epoch": 1,
              "route_digest": ROUTE, "manifest_digest": MANIFEST, "recipe_digest": RECIPE,
              "architecture": "llama", "block_count": 30, "ready": True, **changes}
    return RouteView(**fields)


def stage_views(**changes: Any) -> list[StageView]:
    return [StageView(name=f"s{i}", begin=b, end=e, endpoint=f"127.0.0.{i + 2}:5000",
                      ready=True, started_at=1_000.0, **changes)
            for i, (b, e) in enumerate(RANGES)]


def samples(epoch: int = 1, slots_free: int = 4) -> dict[str, StageSample]:
    return {f"s{i}": StageSample(
        f"127.0.0.{i + 2}:5000",
        info=WorkerInfo(route_id="default/r1", epoch=epoch, incarnation=f"inc{i}",
                        manifest_digest="", recipe_digest="", route_digest="",
                        architecture="llama", n_layer=30, begin=b, end=e,
                        boundary_dtype="f32", boundary_row_elements=576,
                        exact_step_rows=8, exact_batching=True),
        capacity=WorkerCapacity(slots_free=slots_free - i % 2, slots_total=4,
                                kv_tokens_free=8192 - 100 * i, kv_tokens_total=8192,
                                queue_depth=i, active_sessions=i % 2,
                                recent_tokens_per_second=12.5 * i))
        for i, (b, e) in enumerate(RANGES)}
