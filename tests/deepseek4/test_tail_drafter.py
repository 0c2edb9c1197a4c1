"""The MTP drafter on the last stage of a deepseek4 route (tiny random-weight models with one
MTP block, small and of V4's depth, real workers on loopback): only the last stage loads
it, it proposes each next verify window's drafts with the sampled token (on the ring and in
the chain's answer), and the tokens stay those of plain decoding and of the unsplit model,
greedy and sampled; on the GPU lane's device too (the small model)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.api.drafter_kind import DrafterKind
from meshnet.local.process import route_key_of
from meshnet.route import RouteDriver, Sampling, StageClient
from meshnet.route.errors import RouteRefused
from meshnet.unsplit import unsplit_tokens

from ..lanes import Lane, on_gpu
from .tail_routes import (
    PROMPT_TOKENS,
    SPLITS,
    TOKENS,
    Drafting,
    TailRoutes,
    kill_costs_one_recovery,
    runs_on_and_off,
)

pytestmark = pytest.mark.slow

DRAFTING = Drafting(DrafterKind.MTP, drafts=3, windows=3)


def tail_routes(lane: Lane, small_mtp: Path, v4_mtp: Path,
                logs: pytest.TempPathFactory) -> TailRoutes:
    return TailRoutes(lane, "test/deepseek4-tail-drafter", DRAFTING,
                      {"small": (small_mtp, None), "v4": (v4_mtp, None)}, logs)


@pytest.fixture(scope="module")
def routes(lanes: Callable[[str], Lane], ds4_small_mtp: Path, ds4_v4_mtp: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[TailRoutes]:
    started = tail_routes(lanes("cpu"), ds4_small_mtp, ds4_v4_mtp, tmp_path_factory)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def gpu_routes(lanes: Callable[[str], Lane], ds4_small_mtp: Path, ds4_v4_mtp: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[TailRoutes]:
    started = tail_routes(lanes("gpu"), ds4_small_mtp, ds4_v4_mtp, tmp_path_factory)
    yield started
    started.stop()


@pytest.mark.parametrize("model", ["small", "v4"])
def test_only_the_last_stage_hosts_the_drafter(routes: TailRoutes, model: str) -> None:
    infos = [StageClient(w.endpoint).info() for w in routes(model, "on")]
    assert [i.HasField("drafter") for i in infos] == [False, False, True]
    drafter = infos[-1].drafter
    last_layer = SPLITS[model][-1][1] - 1
    assert (drafter.kind, drafter.max_drafts, list(drafter.target_layers)) == (
        "mtp", DRAFTING.drafts, [last_layer])
    assert drafter.n_vocab == infos[-1].n_vocab
    assert drafter.weight_bytes > 0 and drafter.state_bytes > 0
    # it pairs each row with its token: the last stage takes the ids beside the boundary
    assert infos[-1].boundary.needs_token_sideband


def test_the_handshake_finds_the_drafter_the_recipe_names_or_refuses_the_route(
    routes: TailRoutes,
) -> None:
    endpoints = [w.endpoint for w in routes("small", "on")]
    with RouteDriver(endpoints, route_key=route_key_of(routes("small", "on")), topology="ring",
                     drafter=DrafterKind.MTP) as driver:
        assert driver.connect(wait=30).drafter is DrafterKind.MTP
    with (RouteDriver([w.endpoint for w in routes("small", "off")],
                      route_key=route_key_of(routes("small", "off")), topology="ring",
                      drafter=DrafterKind.MTP) as driver, pytest.raises(RouteRefused) as refused):
        driver.connect()  # no wait: refused at the first answers
    assert refused.value.reason == "DrafterMissing"


# V4's depth only on the CPU lane: the GPU lane's software device in `make test` is slow
@pytest.mark.parametrize(("model", "lane"), [("small", "cpu"), ("v4", "cpu"),
                                            on_gpu("small", "gpu")])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.8, top_k=20, seed=7)],
                         ids=["greedy", "sampled"])
def test_the_drafter_on_and_off_gives_the_plain_tokens(
    request: pytest.FixtureRequest, ds4_small: Path, ds4_v4: Path, model: str, lane: str,
    sampling: Sampling,
) -> None:
    routes = request.getfixturevalue("routes" if lane == "cpu" else "gpu_routes")
    kinds = ["on", "off", "chain"] if model == "small" and lane == "cpu" else ["on", "off"]
    runs = runs_on_and_off(routes, model, kinds, sampling)
    # the unsplit model without the MTP block (the same weights) on the CPU
    if sampling.temperature == 0 and lane == "cpu":
        unsplit = ds4_small if model == "small" else ds4_v4
        assert runs["off", "plain"].tokens == unsplit_tokens(unsplit, PROMPT_TOKENS, TOKENS,
                                                             threads=1)


def test_killing_and_restarting_the_last_stage_costs_one_recovery_and_no_text(
    routes: TailRoutes,
) -> None:
    """The restarted last stage rebuilds the drafter's state as the driver re-prefills (its
    KV is fed the prompt's rows again) and drafts the windows after it."""
    kill_costs_one_recovery(routes, tokens=160)


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
    assert unknown.returncode != 0 and "bad value for --drafter: 'eagle'" in unknown.stderr
    help_text = subprocess.run([str(shard_worker), "--help"], capture_output=True, text=True,
                               timeout=30, check=False)
    assert "--drafter mtp" in help_text.stdout + help_text.stderr
    assert "--drafter-k N" in help_text.stdout + help_text.stderr
