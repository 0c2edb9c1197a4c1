"""deepseek4 split into layer-range stages computes exactly what the unsplit model does:
bit-identical logits with f32 boundaries on the CPU and the same greedy tokens, over a
prompt long enough that every compressed cache commits blocks and the sliding window
wraps; each stage holds only its own weights and per-layer state. On the GPU lane too,
every layer on its device on both sides (the small model)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meshnet.artifacts.facts import model_facts, stage_footprint
from meshnet.artifacts.gguf_header import read_header
from meshnet.artifacts.splitset import order_split_set
from meshnet.devtools.tiny_deepseek4 import SMALL, V4_DEPTH
from meshnet.parity import ParityReport, SplitResult, run_parity
from meshnet.paths import workspace
from meshnet.pin.workspace import Workspace
from meshnet.reconcile.route.worker_command import OFFLOAD_ALL_LAYERS

from ..lanes import GPU_LANE, on_gpu

pytestmark = pytest.mark.slow

N_PROMPT = 320  # > 2 HCA blocks of 128, many CSA blocks of 4, the 16-token window wrapped
N_DECODE = 32

# SMALL: ratios 0,0,4,128,4,128,4,0; layers 0-2 hash-routed.
SMALL_SPLITS = [
    "0:4,4:8",
    "0:1,1:2,2:3,3:8",  # seams inside the hash layers, one-layer stages
    "0:2,2:8",  # a first stage with no compressed layer
    "0:3,3:4,4:8",  # 3:4 holds one HCA layer: no indexer
    "0:7,7:8",  # a last stage with no compressed layer
    "0:1,1:2,2:3,3:4,4:5,5:6,6:7,7:8",
]
# fewer on the GPU lane (Mesa's slow software device in `make test`)
GPU_SMALL_SPLITS = ["0:4,4:8", "0:1,1:2,2:3,3:8", "0:7,7:8"]
# V4_DEPTH: 0-1 and 42 sliding-window only, 2-41 alternate CSA (even) and HCA (odd).
V4_SPLITS = [
    "0:15,15:29,29:43",
    "0:1,1:2,2:3,3:43",
    "0:2,2:22,22:43",
    "0:3,3:4,4:43",
    "0:42,42:43",
    "0:10,10:20,20:30,30:43",
    "0:1,1:3,3:5,5:9,9:13,13:17,17:21,21:25,25:30,30:36,36:43",  # 11 stages
    ",".join(f"{i}:{i + 1}" for i in range(43)),  # every layer its own stage
]


ALIGNMENT = 32  # ggml's CPU buffer alignment


def owned_tensor_count(tensors: dict[str, int], begin: int, end: int, n_layer: int) -> int:
    def owned(name: str) -> bool:
        if name.startswith("blk."):
            return begin <= int(name.split(".")[1]) < end
        if name.startswith("token_embd."):
            return begin == 0
        return end == n_layer  # output norm, head and the mHC head
    return sum(1 for name in tensors if owned(name))


def parity(model: Path, splits: list[str], **options: object) -> ParityReport:
    return run_parity(model, splits, Workspace(workspace()), n_prompt=N_PROMPT,
                      n_decode=N_DECODE, threads=1, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def small_report(ds4_small: Path) -> ParityReport:
    return parity(ds4_small, SMALL_SPLITS)


@pytest.fixture(scope="module")
def gpu_small_report(ds4_small: Path) -> ParityReport:
    """The full prompt (the indexer's top-k and the compressed caches run), 8 greedy steps."""
    return run_parity(ds4_small, GPU_SMALL_SPLITS, Workspace(workspace()), n_prompt=N_PROMPT,
                      n_decode=8, threads=1, lane=GPU_LANE, gpu_layers=OFFLOAD_ALL_LAYERS)


@pytest.fixture(scope="module")
def v4_report(ds4_v4: Path) -> ParityReport:
    return parity(ds4_v4, V4_SPLITS)


def result(report: ParityReport, split: str) -> SplitResult:
    return next(r for r in report.splits if r.split == split)


@pytest.mark.parametrize(("lane", "split"),
                         [*(("cpu", split) for split in SMALL_SPLITS),
                          *(on_gpu("gpu", split) for split in GPU_SMALL_SPLITS)])
def test_a_split_of_the_small_model_is_bit_identical(request: pytest.FixtureRequest, lane: str,
                                                     split: str) -> None:
    report = request.getfixturevalue("small_report" if lane == "cpu" else "gpu_small_report")
    outcome = result(report, split)
    assert outcome.error is None
    assert outcome.greedy_identical and outcome.first_divergence is None
    assert outcome.max_abs_logit_diff == 0.0
    assert outcome.ok


@pytest.mark.parametrize("split", V4_SPLITS)
def test_a_split_of_the_v4_depth_model_is_bit_identical(v4_report: ParityReport,
                                                        split: str) -> None:
    outcome = result(v4_report, split)
    assert outcome.error is None
    assert outcome.greedy_identical and outcome.first_divergence is None
    assert outcome.max_abs_logit_diff == 0.0
    assert outcome.ok


def test_the_runs_cover_a_long_prefill_and_decode_of_deepseek4(
    small_report: ParityReport, v4_report: ParityReport,
) -> None:
    assert (small_report.arch, small_report.n_layer) == ("deepseek4", SMALL.n_layer)
    assert (v4_report.arch, v4_report.n_layer) == ("deepseek4", V4_DEPTH.n_layer)
    for report in (small_report, v4_report):
        assert report.n_prompt == N_PROMPT and report.n_decode == N_DECODE
        assert len(report.raw["reference"]["tokens"]) == N_DECODE + 1
        assert report.raw["boundary_schema"] == "MHC_RESIDUAL"
        assert report.raw["boundary_row_bytes"] == 4 * SMALL.n_embd * 4


def test_every_seam_carries_the_hyper_connection_stream_and_token_ids_where_hashed(
    small_report: ParityReport,
) -> None:
    seams = result(small_report, "0:1,1:2,2:3,3:8").seams
    assert [s.after_layer for s in seams] == [1, 2, 3]
    for seam in seams:
        assert (seam.schema, seam.row_shape, seam.dtype) == ("MHC_RESIDUAL", (4, 64), "f32")
    # stages starting at 1 and 2 own hash-routed layers; the one starting at 3 does not
    assert [s.token_sideband for s in seams] == [True, True, False]
    assert [s.bytes_per_token for s in seams] == [4 * 64 * 4 + 4, 4 * 64 * 4 + 4, 4 * 64 * 4]


@pytest.mark.parametrize("which", ["small", "v4"])
def test_stage_weights_are_exactly_their_tensors_and_state_sums_to_the_unsplit(
    which: str, small_report: ParityReport, v4_report: ParityReport,
    ds4_small: Path, ds4_v4: Path,
) -> None:
    report, model = (small_report, ds4_small) if which == "small" else (v4_report, ds4_v4)
    header = read_header(model)
    facts = model_facts(order_split_set([header]))
    for outcome in report.splits:
        stages = outcome.stages
        for stage in stages:
            # the buffers hold exactly the owned tensors, each padded to ggml's alignment
            owned = stage_footprint(facts, stage.begin, stage.end)
            tensors = owned_tensor_count(header.tensor_bytes, stage.begin, stage.end,
                                         report.n_layer)
            assert owned <= stage.weight_bytes <= owned + ALIGNMENT * tensors
        assert sum(s.weight_bytes for s in stages) == report.reference.weight_bytes
        assert sum(s.kv_bytes for s in stages) == report.reference.kv_bytes


def test_quantized_experts_split_exactly_too(ds4_small_q8: Path) -> None:
    report = parity(ds4_small_q8, ["0:2,2:5,5:8", "0:1,1:2,2:8"])
    assert report.ok
    assert [r.max_abs_logit_diff for r in report.splits] == [0.0, 0.0]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_boundaries_keep_the_greedy_tokens(ds4_small: Path, dtype: str) -> None:
    report = parity(ds4_small, ["0:4,4:8", "0:1,1:2,2:3,3:8"], boundary_dtype=dtype,
                    tolerance=1.0)
    assert report.boundary_dtype == dtype
    for outcome in report.splits:
        assert outcome.greedy_identical, outcome
        assert outcome.max_abs_logit_diff is not None and outcome.max_abs_logit_diff > 0.0
        assert all(seam.bytes_per_token >= 4 * 64 * 2 for seam in outcome.seams)
        assert all(seam.dtype == dtype for seam in outcome.seams)


def test_a_wrong_boundary_is_caught(ds4_small: Path) -> None:
    report = parity(ds4_small, ["0:4,4:8"], perturb=0.01)
    assert not report.ok
    assert report.splits[0].max_abs_logit_diff != 0.0


def test_meshnet_parity_names_the_schema_that_crossed_each_seam(ds4_small: Path,
                                                                smollm2: Path) -> None:
    def meshnet_parity(model: Path, split: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "meshnet.cli", "parity", "--model", str(model), "--split",
             split, "--n-prompt", "64", "--n-decode", "4", "--threads", "1"],
            capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    deepseek4 = meshnet_parity(ds4_small, "0:2,2:8")
    assert "(deepseek4, 8 layers)" in deepseek4
    assert "seam  after layer 2: MHC_RESIDUAL[4, 64] f32 + token ids, 1028 bytes/token" in deepseek4
    llama = meshnet_parity(smollm2, "0:15,15:30")
    assert "seam  after layer 15: DENSE_RESIDUAL[576] f32, 2304 bytes/token" in llama
