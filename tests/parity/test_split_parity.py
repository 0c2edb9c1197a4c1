"""A model split into layer-range stages computes exactly what the unsplit model computes,
and every stage holds only its own weights and KV (SmolLM2-135M Q4_1, 30 layers); on the
GPU lane too (tests/lanes.py), every layer on its device on both sides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from meshnet.parity import ParityReport, SplitResult, parse_split, run_parity
from meshnet.paths import workspace
from meshnet.pin.workspace import Workspace
from meshnet.reconcile.route.worker_command import OFFLOAD_ALL_LAYERS

from ..lanes import GPU_LANE, on_gpu

SPLITS = ["0:15,15:30", "0:10,10:20,20:30", "0:1,1:29,29:30", "0:7,7:8,8:22,22:30"]
# fewer on the GPU lane (Mesa's slow software device in `make test`): a seam mid-model
# and one-layer ends
GPU_SPLITS = ["0:15,15:30", "0:1,1:29,29:30"]
N_LAYER = 30

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(parity_tool: Path, smollm2: Path) -> ParityReport:
    """One run of the tool over every split: 64 prompt tokens, then 32 greedy steps."""
    return run_parity(smollm2, SPLITS, Workspace(workspace()), n_prompt=64, n_decode=32,
                      threads=2)


@pytest.fixture(scope="module")
def gpu_report(smollm2: Path) -> ParityReport:
    """The GPU lane, both sides on its device: 32 prompt tokens, then 8 greedy steps."""
    return run_parity(smollm2, GPU_SPLITS, Workspace(workspace()), n_prompt=32, n_decode=8,
                      threads=2, lane=GPU_LANE, gpu_layers=OFFLOAD_ALL_LAYERS)


def split_result(report: ParityReport, split: str) -> SplitResult:
    return next(result for result in report.splits if result.split == split)


@pytest.mark.parametrize("split", SPLITS)
def test_split_gives_the_unsplit_greedy_tokens_and_logits(report: ParityReport, split: str) -> None:
    result = split_result(report, split)
    assert result.error is None
    assert result.greedy_identical
    assert result.first_divergence is None
    assert result.max_abs_logit_diff is not None
    assert result.max_abs_logit_diff <= 1e-4
    assert result.ok


@pytest.mark.parametrize("lane", ["cpu", on_gpu("gpu")])
def test_f32_boundaries_give_bit_identical_logits(request: pytest.FixtureRequest,
                                                  lane: str) -> None:
    """On the CPU lane and on the GPU lane (vulkan: patch 0020: a one-row graph fused the RMS
    norm into the add before it, which a stage starting at that norm does not have)."""
    report = request.getfixturevalue("report" if lane == "cpu" else "gpu_report")
    assert [(r.split, r.error, r.greedy_identical, r.max_abs_logit_diff)
            for r in report.splits] == [(split, None, True, 0.0)
                                        for split in (SPLITS if lane == "cpu" else GPU_SPLITS)]


def test_the_run_covers_a_real_prefill_and_decode(report: ParityReport) -> None:
    assert report.ok
    assert report.n_prompt >= 64
    assert report.n_decode >= 32
    assert len(report.raw["reference"]["tokens"]) == report.n_decode + 1
    assert report.raw["boundary_row_bytes"] == 576 * 4


@pytest.mark.parametrize("split", SPLITS)
def test_each_stage_holds_only_its_layers_and_embeddings_or_head_where_owned(
    report: ParityReport, split: str, owned_tensor_bytes: Callable[[int, int], int],
) -> None:
    stages = split_result(report, split).stages
    assert [(s.begin, s.end) for s in stages] == [
        (span.begin, span.end) for span in parse_split(split)
    ]
    for stage in stages:
        expected = owned_tensor_bytes(stage.begin, stage.end)
        assert expected <= stage.weight_bytes <= 1.05 * expected, (stage, expected)


def test_the_unsplit_model_holds_every_tensor_once(
    report: ParityReport, owned_tensor_bytes: Callable[[int, int], int],
) -> None:
    expected = owned_tensor_bytes(0, N_LAYER)
    assert expected <= report.reference.weight_bytes <= 1.05 * expected


@pytest.mark.parametrize("split", SPLITS)
def test_each_stage_allocates_kv_for_its_own_layers_only(report: ParityReport, split: str) -> None:
    per_layer = report.reference.kv_bytes // N_LAYER
    assert per_layer * N_LAYER == report.reference.kv_bytes
    for stage in split_result(report, split).stages:
        assert stage.kv_bytes == per_layer * (stage.end - stage.begin)


def test_a_wrong_boundary_is_caught(parity_tool: Path, smollm2: Path) -> None:
    """The comparison is not vacuous: nudging every boundary value by 0.01 fails the split."""
    perturbed = run_parity(smollm2, ["0:15,15:30"], Workspace(workspace()), n_prompt=64,
                           n_decode=4, threads=2, perturb=0.01)
    assert not perturbed.ok
    result = perturbed.splits[0]
    assert not result.ok
    assert result.max_abs_logit_diff is not None and result.max_abs_logit_diff > 1e-4
