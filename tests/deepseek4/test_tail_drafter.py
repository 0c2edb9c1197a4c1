"""The MTP drafter on the last stage of a deepseek4 route (tiny random-weight models with one
MTP block, small and of V4's depth, real workers on loopback): only the last stage loads
it, it proposes each next verify window's drafts with the sampled token (on the ring and in
the chain's answer), and the tokens stay those of plain decoding and of the unsplit model,
greedy and sampled."""

from __future__ import annotations

import re
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route
from meshnet.route import RouteDriver, Sampling, StageClient
from meshnet.route.errors import RouteRefused
from meshnet.unsplit import unsplit_tokens

pytestmark = pytest.mark.slow

ROUTE_ID = "test/deepseek4-tail-drafter"
# the small model as 0:2, 2:3, 3:8; V4's 43 layers with a seam inside the hash-routed ones
SPLITS = {"small": [(0, 2), (2, 3), (3, 8)], "v4": [(0, 2), (2, 22), (22, 43)]}
DRAFTS, WINDOWS = 3, 3
DISCARD_DEPTH = WINDOWS * (DRAFTS + 1) - 1
TOKENS = 32
# ids of distinct byte and piece tokens: nothing repeats, so prompt lookup has little to say
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
    """Routes of the MTP models, started on first use and stopped with the module:
    (model, "on" | "off" | "chain") -> workers; "chain" has no ring."""

    def __init__(self, binary: Path, models: dict[str, Path], logs: pytest.TempPathFactory):
        self.binary, self.models, self.logs = binary, models, logs
        self.started: dict[tuple[str, str], list[WorkerProcess]] = {}

    def __call__(self, model: str, kind: str) -> list[WorkerProcess]:
        if (model, kind) not in self.started:
            split = SPLITS[model]
            drafter = "mtp" if kind != "off" else None
            # "restart": the loop's answers reach the driver as they come, not every 100 ms,
            # so that it sees a token before the loop has run far ahead of it
            flush = ("--stream-flush-ms", "0") if kind == "restart" else ()
            specs = [LaunchSpec(model=self.models[model], layers=LayerRange(*span),
                                route_id=ROUTE_ID, threads=1, ctx=512,
                                discard_depth=DISCARD_DEPTH,
                                drafter=drafter if span == split[-1] else None,
                                drafter_k=DRAFTS if drafter and span == split[-1] else None,
                                extra=flush if span == split[0] else ())
                     for span in split]
            self.started[model, kind] = start_route(
                self.binary, specs, self.logs.mktemp(f"ds4-tail-{model}-{kind}"), chain=True,
                ring=kind != "chain")
        return self.started[model, kind]

    def stop(self) -> None:
        for workers in self.started.values():
            for worker in workers:
                worker.stop()


@pytest.fixture(scope="module")
def routes(shard_worker: Path, ds4_small_mtp: Path, ds4_v4_mtp: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routes]:
    started = Routes(shard_worker, {"small": ds4_small_mtp, "v4": ds4_v4_mtp}, tmp_path_factory)
    yield started
    started.stop()


@pytest.mark.parametrize("model", ["small", "v4"])
def test_only_the_last_stage_hosts_the_drafter(routes: Routes, model: str) -> None:
    infos = [StageClient(w.endpoint).info() for w in routes(model, "on")]
    assert [i.HasField("drafter") for i in infos] == [False, False, True]
    drafter = infos[-1].drafter
    last_layer = SPLITS[model][-1][1] - 1
    assert (drafter.kind, drafter.max_drafts, list(drafter.target_layers)) == (
        "mtp", DRAFTS, [last_layer])
    assert drafter.n_vocab == infos[-1].n_vocab
    assert drafter.weight_bytes > 0 and drafter.state_bytes > 0
    # it pairs each row with its token: the last stage takes the ids beside the boundary
    assert infos[-1].boundary.needs_token_sideband


def test_the_handshake_finds_the_drafter_the_recipe_names_or_refuses_the_route(
    routes: Routes,
) -> None:
    endpoints = [w.endpoint for w in routes("small", "on")]
    with RouteDriver(endpoints, topology="ring", drafter="mtp") as driver:
        assert driver.connect(wait=30).drafter == "mtp"
    with (RouteDriver([w.endpoint for w in routes("small", "off")], topology="ring",
                      drafter="mtp") as driver, pytest.raises(RouteRefused) as refused):
        driver.connect()  # no wait: refused at the first answers
    assert refused.value.reason == "DrafterMissing"


@pytest.mark.parametrize("model", ["small", "v4"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_k=20, seed=7)],
                         ids=["greedy", "sampled"])
def test_the_drafter_on_and_off_gives_the_plain_tokens(
    routes: Routes, ds4_small: Path, ds4_v4: Path, model: str, sampling: Sampling,
) -> None:
    runs = {}
    kinds = ["on", "off", "chain"] if model == "small" else ["on", "off"]
    for kind in kinds:
        workers = routes(model, kind)
        topology = "chain" if kind == "chain" else "ring"
        with RouteDriver([w.endpoint for w in workers], topology=topology) as driver:
            driver.connect(wait=30)
            passes = drafting_passes(workers[-1]) if kind != "off" else 0
            runs[kind, "plain"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                  stop_at_eos=False, sampling=sampling)
            if kind != "off":  # plain decoding asks for no drafts: the drafter costs it nothing
                assert drafting_passes(workers[-1]) == passes
            runs[kind, "serial"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                   stop_at_eos=False, sampling=sampling,
                                                   speculate=DRAFTS, windows=1)
            runs[kind, "piped"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                  stop_at_eos=False, sampling=sampling,
                                                  speculate=DRAFTS, windows=WINDOWS)
    plain = runs["off", "plain"].tokens
    assert all(run.tokens == plain for run in runs.values())
    assert all(run.recoveries == 0 for run in runs.values())
    if sampling.temperature == 0:  # the unsplit model without the MTP block: the same weights
        unsplit = ds4_small if model == "small" else ds4_v4
        assert plain == unsplit_tokens(unsplit, PROMPT_TOKENS, TOKENS, threads=1)
    # every window after the first carries the drafter's K drafts (lookup had few to offer),
    # by the ring or, without one, in the chain's answer
    for kind in kinds[:1] + kinds[2:]:
        serial = runs[kind, "serial"]
        assert serial.draft_tokens >= DRAFTS * (TOKENS // (DRAFTS + 1)), serial.to_json()
        assert serial.draft_tokens > runs["off", "serial"].draft_tokens
    for key, run in runs.items():
        print(f"{model} {sampling} {key}: drafts {run.draft_tokens}, accepted "
              f"{run.accepted_draft_tokens} ({run.acceptance_rate:.3f}), depth {run.loop_depth}")


def test_killing_and_restarting_the_last_stage_costs_one_recovery_and_no_text(
    routes: Routes,
) -> None:
    """The restarted last stage rebuilds the drafter's state as the driver re-prefills (its
    KV is fed the prompt's rows again) and drafts the windows after it."""
    workers = routes("small", "restart")
    last = workers[-1]
    tokens, seen = 160, [0]

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


def test_a_drafter_the_stage_cannot_host_is_refused_at_start(
    shard_worker: Path, ds4_small: Path, ds4_small_mtp: Path,
) -> None:
    def start(model: Path, layers: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(shard_worker), "--model", str(model), "--layers", layers,
                               "--listen", "127.0.0.1:0", "--metrics-listen", "", *flags],
                              capture_output=True, text=True, timeout=60, check=False)

    not_last = start(ds4_small_mtp, "0:3", "--drafter", "mtp")
    assert not_last.returncode == 1
    assert "only the stage owning it (the route's last) can host it, not layers 0:3" in (
        not_last.stderr)
    no_mtp = start(ds4_small, "3:8", "--drafter", "mtp")
    assert no_mtp.returncode == 1 and "with 0 MTP layers" in no_mtp.stderr
    for k in ("0", "8", "x"):
        bad_k = start(ds4_small_mtp, "3:8", "--drafter", "mtp", "--drafter-k", k)
        assert bad_k.returncode != 0 and "--drafter-k" in bad_k.stderr, bad_k.stderr
    unknown = start(ds4_small_mtp, "3:8", "--drafter", "eagle")
    assert unknown.returncode != 0 and "--drafter takes mtp" in unknown.stderr
    help_text = subprocess.run([str(shard_worker), "--help"], capture_output=True, text=True,
                               timeout=30, check=False)
    assert "--drafter mtp" in help_text.stdout + help_text.stderr
    assert "--drafter-k N" in help_text.stdout + help_text.stderr
