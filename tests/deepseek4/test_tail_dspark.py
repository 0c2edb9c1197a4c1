"""A DSpark drafter GGUF on the last stage of a deepseek4 route (the tiny 8-layer model and its
tiny random-weight drafter reading layers 5-7, and the 43-layer one with a drafter reading
layers 40-42 as V4-Flash's does; real workers on loopback): only the last
stage loads it and the token embeddings it borrows, it drafts each next verify window from
the hidden states of the layers it taps, and the tokens stay those of plain decoding,
greedy and sampled; a stage that cannot host it refuses to start, saying why."""

from __future__ import annotations

import re
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gguf import GGUFWriter

from meshnet.api.shardroute import LayerRange
from meshnet.devtools import tiny_dspark
from meshnet.devtools.tiny_deepseek4 import SMALL, vocabulary
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route
from meshnet.route import RouteDriver, Sampling, StageClient
from meshnet.unsplit import unsplit_tokens

pytestmark = pytest.mark.slow

ROUTE_ID = "test/deepseek4-tail-dspark"
# the drafters read layers 5-7 and 40-42: all on the last stage
SPLITS = {"small": [(0, 2), (2, 3), (3, 8)], "v4": [(0, 2), (2, 22), (22, 43)]}
TAPPED = {"small": [5, 6, 7], "v4": [40, 41, 42]}
DRAFTS, WINDOWS = 4, 3  # 4 of the drafter's block of 5
DISCARD_DEPTH = WINDOWS * (DRAFTS + 1) - 1
TOKENS = 32
PROMPT_TOKENS = [1, *range(20, 60)]


def drafting_passes(worker: WorkerProcess) -> int:
    """How many times the stage's drafter drafted (its /metrics histogram's count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics",
                                timeout=10) as page:
        text = page.read().decode()
    found = re.search(r"^meshnet_shard_draft_seconds_count (\d+)$", text, re.MULTILINE)
    assert found, text
    return int(found.group(1))


class Routes:
    """Routes of a model and its drafter, started on first use and stopped with the module:
    (model, "on" | "off" | "restart"); "restart" is "on" with answers unbatched."""

    def __init__(self, binary: Path, models: dict[str, tuple[Path, Path]],
                 logs: pytest.TempPathFactory):
        self.binary, self.models, self.logs = binary, models, logs
        self.started: dict[tuple[str, str], list[WorkerProcess]] = {}

    def __call__(self, model: str, kind: str) -> list[WorkerProcess]:
        if (model, kind) not in self.started:
            split, (path, drafter) = SPLITS[model], self.models[model]
            drafting = kind != "off"
            flush = ("--stream-flush-ms", "0") if kind == "restart" else ()
            specs = [LaunchSpec(model=path, layers=LayerRange(*span), route_id=ROUTE_ID,
                                threads=1, ctx=512, discard_depth=DISCARD_DEPTH,
                                drafter="dspark" if drafting and span == split[-1] else None,
                                drafter_k=DRAFTS if drafting and span == split[-1] else None,
                                drafter_model=drafter if drafting and span == split[-1] else None,
                                extra=flush if span == split[0] else ())
                     for span in split]
            self.started[model, kind] = start_route(
                self.binary, specs, self.logs.mktemp(f"ds4-dspark-{model}-{kind}"), chain=True,
                ring=True)
        return self.started[model, kind]

    def stop(self) -> None:
        for workers in self.started.values():
            for worker in workers:
                worker.stop()


@pytest.fixture(scope="module")
def routes(shard_worker: Path, ds4_small: Path, ds4_dspark: Path, ds4_v4: Path,
           ds4_v4_dspark: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routes]:
    started = Routes(shard_worker, {"small": (ds4_small, ds4_dspark),
                                    "v4": (ds4_v4, ds4_v4_dspark)}, tmp_path_factory)
    yield started
    started.stop()


@pytest.mark.parametrize("model", ["small", "v4"])
def test_only_the_last_stage_hosts_the_drafter(routes: Routes, model: str) -> None:
    """(That the other stages hold exactly what they hold without it, and the last grew by
    drafter.weight_bytes, test-deepseek4-dspark checks on the engines' footprints.)"""
    infos = [StageClient(w.endpoint).info() for w in routes(model, "on")]
    assert [i.HasField("drafter") for i in infos] == [False, False, True]
    drafter = infos[-1].drafter
    assert (drafter.kind, drafter.max_drafts, list(drafter.target_layers)) == (
        "dspark", DRAFTS, TAPPED[model])
    assert drafter.n_vocab == infos[-1].n_vocab
    # its own file's tensors and the token embeddings it borrows
    assert drafter.weight_bytes > routes.models[model][1].stat().st_size // 2
    assert drafter.state_bytes > 0
    # it drafts from the sampled token and the tapped rows: no token ids beside the boundary
    assert not infos[-1].boundary.needs_token_sideband


@pytest.mark.parametrize("model", ["small", "v4"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_k=20, seed=7)],
                         ids=["greedy", "sampled"])
def test_the_dspark_drafter_on_and_off_gives_the_plain_tokens(
    routes: Routes, model: str, sampling: Sampling,
) -> None:
    runs = {}
    for kind in ("on", "off"):
        workers = routes(model, kind)
        with RouteDriver([w.endpoint for w in workers], topology="ring") as driver:
            driver.connect(wait=30)
            runs[kind, "plain"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                  stop_at_eos=False, sampling=sampling)
            runs[kind, "serial"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                   stop_at_eos=False, sampling=sampling,
                                                   speculate=DRAFTS, windows=1)
            runs[kind, "piped"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                  stop_at_eos=False, sampling=sampling,
                                                  speculate=DRAFTS, windows=WINDOWS)
    plain = runs["off", "plain"].tokens
    assert all(run.tokens == plain for run in runs.values())
    assert all(run.recoveries == 0 for run in runs.values())
    if sampling.temperature == 0:
        assert plain == unsplit_tokens(routes.models[model][0], PROMPT_TOKENS, TOKENS, threads=1)
    # every window after the first carries the drafter's drafts (lookup has few to offer)
    serial = runs["on", "serial"]
    assert serial.draft_tokens >= DRAFTS * (TOKENS // (DRAFTS + 1)), serial.to_json()
    assert serial.draft_tokens > runs["off", "serial"].draft_tokens
    for key, run in runs.items():
        print(f"dspark {model} {sampling} {key}: drafts {run.draft_tokens}, accepted "
              f"{run.accepted_draft_tokens} ({run.acceptance_rate:.3f}), depth {run.loop_depth}")


def test_killing_and_restarting_the_last_stage_costs_one_recovery_and_no_text(
    routes: Routes,
) -> None:
    """The restarted last stage refills the drafter's KV as the driver re-prefills (the
    tapped rows of the prompt come again) and drafts the windows after it."""
    workers = routes("small", "restart")
    last = workers[-1]
    tokens, seen = 120, [0]

    def kill_then_restart_later(_: int) -> None:
        seen[0] += 1
        if seen[0] == 2:
            last.kill()
            threading.Timer(0.5, last.start).start()

    with RouteDriver([w.endpoint for w in workers], topology="ring") as driver:
        driver.connect(wait=30)
        expected = driver.generate(PROMPT_TOKENS, max_tokens=tokens, stop_at_eos=False,
                                   speculate=DRAFTS, windows=1)
        generation = driver.generate(PROMPT_TOKENS, max_tokens=tokens, stop_at_eos=False,
                                     speculate=DRAFTS, windows=1, on_token=kill_then_restart_later)
    assert generation.tokens == expected.tokens
    assert generation.recoveries == 1
    assert drafting_passes(last) > 0  # counted since the restart


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
