"""A DSpark drafter GGUF on the last stage of a deepseek4 route (the tiny 8-layer model and its
tiny random-weight drafter reading layers 5-7, and the 43-layer one with a drafter reading
layers 40-42 as V4-Flash's does; real workers on loopback): only the last
stage loads it and the token embeddings it borrows, it drafts each next verify window from
the hidden states of the layers it taps, and the tokens stay those of plain decoding,
greedy and sampled (on the GPU lane's device too, the small model); a stage that cannot
host it refuses to start, saying why."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gguf import GGUFWriter

from meshnet.api.drafter_kind import DrafterKind
from meshnet.devtools import tiny_dspark
from meshnet.devtools.tiny_deepseek4 import SMALL, vocabulary
from meshnet.route import Sampling, StageClient
from meshnet.unsplit import unsplit_tokens

from ..lanes import Lane, on_gpu
from .tail_routes import (
    PROMPT_TOKENS,
    TOKENS,
    Drafting,
    TailRoutes,
    kill_costs_one_recovery,
    runs_on_and_off,
)

pytestmark = pytest.mark.slow

DRAFTING = Drafting(DrafterKind.DSPARK, drafts=4, windows=3)  # 4 of the drafter's block of 5
# the drafters read layers 5-7 and 40-42: all on the last stage
TAPPED = {"small": [5, 6, 7], "v4": [40, 41, 42]}


def tail_routes(lane: Lane, models: dict[str, tuple[Path, Path | None]],
                logs: pytest.TempPathFactory) -> TailRoutes:
    return TailRoutes(lane, "test/deepseek4-tail-dspark", DRAFTING, models, logs)


@pytest.fixture(scope="module")
def routes(lanes: Callable[[str], Lane], ds4_small: Path, ds4_dspark: Path, ds4_v4: Path,
           ds4_v4_dspark: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TailRoutes]:
    started = tail_routes(lanes("cpu"), {"small": (ds4_small, ds4_dspark),
                                         "v4": (ds4_v4, ds4_v4_dspark)}, tmp_path_factory)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def gpu_routes(lanes: Callable[[str], Lane], ds4_small: Path, ds4_dspark: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[TailRoutes]:
    started = tail_routes(lanes("gpu"), {"small": (ds4_small, ds4_dspark)}, tmp_path_factory)
    yield started
    started.stop()


@pytest.mark.parametrize("model", ["small", "v4"])
def test_only_the_last_stage_hosts_the_drafter(routes: TailRoutes, model: str) -> None:
    """(That the other stages hold exactly what they hold without it, and the last grew by
    drafter.weight_bytes, test-deepseek4-dspark checks on the engines' footprints.)"""
    infos = [StageClient(w.endpoint).info() for w in routes(model, "on")]
    assert [i.HasField("drafter") for i in infos] == [False, False, True]
    drafter = infos[-1].drafter
    assert (drafter.kind, drafter.max_drafts, list(drafter.target_layers)) == (
        "dspark", DRAFTING.drafts, TAPPED[model])
    assert drafter.n_vocab == infos[-1].n_vocab
    # its own file's tensors and the token embeddings it borrows
    assert drafter.weight_bytes > routes.models[model][1].stat().st_size // 2
    assert drafter.state_bytes > 0
    # it drafts from the sampled token and the tapped rows: no token ids beside the boundary
    assert not infos[-1].boundary.needs_token_sideband


# V4's depth only on the CPU lane: the GPU lane's software device in `make test` is slow
@pytest.mark.parametrize(("model", "lane"), [("small", "cpu"), ("v4", "cpu"),
                                            on_gpu("small", "gpu")])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_k=20, seed=7)],
                         ids=["greedy", "sampled"])
def test_the_dspark_drafter_on_and_off_gives_the_plain_tokens(
    request: pytest.FixtureRequest, model: str, lane: str, sampling: Sampling,
) -> None:
    routes = request.getfixturevalue("routes" if lane == "cpu" else "gpu_routes")
    runs = runs_on_and_off(routes, model, ["on", "off"], sampling)
    if sampling.temperature == 0 and lane == "cpu":
        assert runs["off", "plain"].tokens == unsplit_tokens(routes.models[model][0],
                                                             PROMPT_TOKENS, TOKENS, threads=1)


def test_killing_and_restarting_the_last_stage_costs_one_recovery_and_no_text(
    routes: TailRoutes,
) -> None:
    """The restarted last stage refills the drafter's KV as the driver re-prefills (the
    tapped rows of the prompt come again) and drafts the windows after it."""
    kill_costs_one_recovery(routes, tokens=120)


def _shorter_vocabulary(writer: GGUFWriter) -> int:
    """The tiny model's tokenizer less its last 5 pieces: a drafter of another vocabulary."""
    tokens, scores, types = vocabulary()
    n = len(tokens) - 5
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens[:n])
    writer.add_token_scores(scores[:n])
    writer.add_token_types(types[:n])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    return n


def test_a_dspark_drafter_the_stage_cannot_host_is_refused_at_start(
    shard_worker: Path, ds4_small: Path, ds4_dspark: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def start(layers: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(shard_worker), "--model", str(ds4_small), "--layers", layers,
                               "--listen", "127.0.0.1:0", "--metrics-listen", "", *flags],
                              capture_output=True, text=True, timeout=60, check=False)

    def dspark(layers: str, drafter: Path, k: str = "3") -> subprocess.CompletedProcess[str]:
        return start(layers, "--drafter", "dspark", "--drafter-model", str(drafter),
                     "--drafter-k", k)

    not_last = dspark("0:3", ds4_dspark)
    assert not_last.returncode == 1
    assert "runs on the last stage of a deepseek4 model, not layers 0:3" in not_last.stderr
    # the input of layer 6 (layer 5's output) is computed before the stage 7:8 begins
    split = dspark("7:8", ds4_dspark)
    assert split.returncode == 1
    assert "reads the outputs of layers 5: this stage runs layers 7..7" in split.stderr
    too_many = dspark("3:8", ds4_dspark, k="6")
    assert too_many.returncode == 1 and "at most 5 tokens per window" in too_many.stderr
    not_dspark = dspark("3:8", ds4_small)
    assert not_dspark.returncode == 1 and "is not a DSpark drafter" in not_dspark.stderr
    monkeypatch.setattr(tiny_dspark, "add_vocabulary", _shorter_vocabulary)
    other = tiny_dspark.write_tiny_dspark(tmp_path / "other-vocab.gguf", SMALL, seed=4)
    mismatch = dspark("3:8", other)
    assert mismatch.returncode == 1
    assert re.search(r"drafter vocabulary mismatch: .* has \d+ tokens, the model \d+",
                     mismatch.stderr), mismatch.stderr
    alone = start("3:8", "--drafter", "dspark")
    assert alone.returncode != 0 and "--drafter dspark and --drafter-model" in alone.stderr
