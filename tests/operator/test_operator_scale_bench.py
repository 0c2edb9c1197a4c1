"""bench/operator_scale.py at its smallest size: it must keep measuring what it reports (a
re-split followed to the end with every route serving), as the operator's rollouts change."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "operator_scale.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("operator_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
async def test_the_operator_bench_follows_a_resplit_to_the_new_epoch_with_every_route_serving(
) -> None:
    # It fails on a route not Ready mid-rollout or a replica showing two epochs, and
    # checks at the end that only the new epoch's pods are left.
    steady, resplit = await load_bench().phases(routes=2, stages=2, timeout=120.0, idle=0.0,
                                                drain_seconds=1)
    assert (steady.name, resplit.name) == ("steady state", "re-split rollout")
    assert 0 < resplit.updated_seconds <= resplit.seconds
    assert "2 routes updated to the new epoch" in resplit.report(2)
