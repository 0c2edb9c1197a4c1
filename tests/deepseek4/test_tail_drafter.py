"""The MTP drafter on the last stage of a deepseek4 route (tiny random-weight model with one
MTP block, real workers on loopback): only the last stage loads it, it proposes each next
verify window's drafts with the sampled token (on the ring and in the chain's answer), and
the tokens stay those of plain decoding and of the unsplit model, greedy and sampled."""

from __future__ import annotations

import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.layers import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route
from meshnet.route import RouteDriver, Sampling, StageClient
from meshnet.unsplit import unsplit_tokens

pytestmark = pytest.mark.slow

ROUTE_ID = "test/deepseek4-tail-drafter"
SPLIT = [(0, 2), (2, 3), (3, 8)]
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


def ring(binary: Path, model: Path, logs: Path, drafter: bool, back_edge: bool = True,
         ) -> list[WorkerProcess]:
    specs = [LaunchSpec(model=model, layers=LayerRange(*span), route_id=ROUTE_ID, threads=1,
                        ctx=512, discard_depth=DISCARD_DEPTH,
                        extra=("--drafter", "mtp", "--drafter-k", str(DRAFTS))
                        if drafter and span[1] == 8 else ())
             for span in SPLIT]
    return start_route(binary, specs, logs, chain=True, ring=back_edge)


@pytest.fixture(scope="module")
def drafting_ring(shard_worker: Path, ds4_small_mtp: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    workers = ring(shard_worker, ds4_small_mtp, tmp_path_factory.mktemp("ds4-tail-on"), True)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def drafting_chain(shard_worker: Path, ds4_small_mtp: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    """No ring: the drafts come back only in the chain's answer."""
    workers = ring(shard_worker, ds4_small_mtp, tmp_path_factory.mktemp("ds4-tail-chain"), True,
                   back_edge=False)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def plain_ring(shard_worker: Path, ds4_small_mtp: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    workers = ring(shard_worker, ds4_small_mtp, tmp_path_factory.mktemp("ds4-tail-off"), False)
    yield workers
    for worker in workers:
        worker.stop()


def test_only_the_last_stage_hosts_the_drafter(drafting_ring: list[WorkerProcess]) -> None:
    infos = [StageClient(w.endpoint).info() for w in drafting_ring]
    assert [i.HasField("drafter") for i in infos] == [False, False, True]
    drafter = infos[-1].drafter
    assert (drafter.kind, drafter.max_drafts, list(drafter.target_layers)) == ("mtp", DRAFTS, [7])
    assert drafter.n_vocab == infos[-1].n_vocab
    assert drafter.weight_bytes > 0 and drafter.state_bytes > 0
    # it pairs each row with its token: the last stage takes the ids beside the boundary
    assert infos[-1].boundary.needs_token_sideband


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_k=20, seed=7)],
                         ids=["greedy", "sampled"])
def test_the_drafter_on_and_off_gives_the_plain_tokens(
    drafting_ring: list[WorkerProcess], drafting_chain: list[WorkerProcess],
    plain_ring: list[WorkerProcess], ds4_small: Path, sampling: Sampling,
) -> None:
    runs = {}
    for name, workers, topology in (("on", drafting_ring, "ring"), ("off", plain_ring, "ring"),
                                    ("chain", drafting_chain, "chain")):
        with RouteDriver([w.endpoint for w in workers], topology=topology) as driver:
            driver.connect(wait=30)
            passes = drafting_passes(workers[-1]) if name != "off" else 0
            runs[name, "plain"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                  stop_at_eos=False, sampling=sampling)
            if name != "off":  # plain decoding asks for no drafts: the drafter costs it nothing
                assert drafting_passes(workers[-1]) == passes
            runs[name, "serial"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                   stop_at_eos=False, sampling=sampling,
                                                   speculate=DRAFTS, windows=1)
            runs[name, "piped"] = driver.generate(PROMPT_TOKENS, max_tokens=TOKENS,
                                                  stop_at_eos=False, sampling=sampling,
                                                  speculate=DRAFTS, windows=WINDOWS)
    plain = runs["off", "plain"].tokens
    assert all(run.tokens == plain for run in runs.values())
    assert all(run.recoveries == 0 for run in runs.values())
    if sampling.temperature == 0:  # the unsplit model without the MTP block: the same weights
        assert plain == unsplit_tokens(ds4_small, PROMPT_TOKENS, TOKENS, threads=1)
    # every window after the first carries the drafter's K drafts (lookup had few to offer),
    # by the ring or, without one, in the chain's answer
    for name in ("on", "chain"):
        serial = runs[name, "serial"]
        assert serial.draft_tokens >= DRAFTS * (TOKENS // (DRAFTS + 1)), serial.to_json()
        assert serial.draft_tokens > runs["off", "serial"].draft_tokens
    for key, run in runs.items():
        print(f"{sampling} {key}: drafts {run.draft_tokens}, accepted {run.accepted_draft_tokens} "
              f"({run.acceptance_rate:.2f}), depth {run.loop_depth}")


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
