"""Sampling real workers: every stage's GetInfo and GetCapacity at once, a stopped or
dead worker costs one deadline, not a hang, a worker started for another artifact
is refused by the driver and reported as a mismatch, and the last stage's draft counters
give the acceptance a route's speculation achieved."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange, Recipe
from meshnet.api.tracker import Provider
from meshnet.certify import lane as lanes
from meshnet.local.process import LaunchSpec, WorkerProcess, start_route
from meshnet.route import RouteDriver, RouteRefused
from meshnet.tracker.acceptance import route_speculation
from meshnet.tracker.collect import StageChannels, sample_stages
from meshnet.tracker.inputs import PinFacts, StageSample, StageView
from meshnet.tracker.report import build_report

from .conftest import MANIFEST, RECIPE, ROUTE, certificate, lane, route_view


@pytest.fixture(scope="module")
def workers(shard_worker: Path, smollm2: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/collect", epoch=5,
                        threads=1, slots=3, ctx=1024, metrics_listen="")
             for span in ((0, 15), (15, 30))]
    running = start_route(shard_worker, specs, tmp_path_factory.mktemp("collect"))
    yield running
    for worker in running:
        worker.stop()


def test_real_workers_answer_their_range_epoch_slots_and_kv(
        workers: list[WorkerProcess]) -> None:
    samples = asyncio.run(sample_stages({"a": workers[0].endpoint, "b": workers[1].endpoint,
                                         "c": None}, timeout=5.0))

    assert set(samples) == {"a", "b"}  # no endpoint, nothing to ask
    a, b = samples["a"], samples["b"]
    assert a.info is not None and b.info is not None and a.capacity is not None
    assert (a.info.begin, a.info.end, b.info.begin, b.info.end) == (0, 15, 15, 30)
    assert (a.info.route_id, a.info.epoch, a.info.architecture) == ("test/collect", 5, "llama")
    assert (a.info.boundary_dtype, a.info.boundary_row_elements) == ("f32", 576)
    assert (a.capacity.slots_total, a.capacity.kv_tokens_total) == (3, 3 * 1024)
    assert a.capacity.slots_free == 3 and a.info.incarnation != b.info.incarnation


# Code the model goes on repeating (edits of the same lines): prompt-lookup drafts hold.
CODE = (
    "# Original:\ndef sum_list(values):\n    total = 0\n    for value in values:\n"
    "        total = total + value\n    return total\n\ndef mean(values):\n"
    "    total = sum_list(values)\n    return total / len(values)\n\n"
    "# The same code with type hints added:\ndef sum_list(values: list[float]) -> float:\n"
)


def test_the_last_stage_counts_the_drafts_a_speculating_driver_had_verified(
        workers: list[WorkerProcess]) -> None:
    endpoints = {"a": workers[0].endpoint, "b": workers[1].endpoint}
    before = asyncio.run(sample_stages(endpoints, timeout=5.0))
    with RouteDriver(list(endpoints.values()), speculate=4) as driver:
        generation = driver.generate(CODE, max_tokens=48, stop_at_eos=False)
    after = asyncio.run(sample_stages(endpoints, timeout=5.0))

    first, last = after["a"].capacity, after["b"].capacity
    earlier = before["b"].capacity
    assert first is not None and last is not None and earlier is not None
    assert generation.accepted_draft_tokens > 0
    assert (last.draft_tokens_verified - earlier.draft_tokens_verified,
            last.draft_tokens_accepted - earlier.draft_tokens_accepted) == (
        generation.draft_tokens, generation.accepted_draft_tokens)
    assert (first.draft_tokens_verified, first.draft_tokens_accepted) == (0, 0)  # not a verifier
    stages = [StageView(name, begin, end, endpoints[name], ready=True)
              for name, (begin, end) in (("a", (0, 15)), ("b", (15, 30)))]
    shown = route_speculation(Recipe.model_validate({"speculation": {"mode": "Lookup"}}),
                              stages, after)
    assert shown == {"acceptance": round(last.draft_tokens_accepted / last.draft_tokens_verified,
                                         3),
                     "draftTokensVerified": last.draft_tokens_verified,
                     "draftTokensAccepted": last.draft_tokens_accepted}


def test_a_stopped_worker_costs_one_deadline_and_the_other_still_answers(
        workers: list[WorkerProcess]) -> None:
    """Both stages and both calls are asked at once: a stopped stage costs the sample one
    deadline, not one per call or stage (two would be 2 x `deadline`). The bound adds
    what sampling the running stages took just before, so a busy machine shifts both."""
    endpoints = {"a": workers[0].endpoint, "b": workers[1].endpoint}
    deadline = 2.0

    def timed_sample() -> tuple[dict[str, StageSample], float]:
        started = time.monotonic()
        samples = asyncio.run(sample_stages(endpoints, timeout=deadline))
        return samples, time.monotonic() - started

    _, baseline = timed_sample()
    os.kill(workers[1].pid, signal.SIGSTOP)
    try:
        samples, elapsed = timed_sample()
    finally:
        os.kill(workers[1].pid, signal.SIGCONT)

    assert samples["a"].capacity is not None
    assert samples["b"].info is None and "DEADLINE_EXCEEDED" in (samples["b"].error or "")
    assert elapsed < 1.5 * deadline + baseline, (elapsed, baseline)


def test_a_port_nobody_listens_on_is_unreachable_at_once() -> None:
    [sample] = asyncio.run(sample_stages({"x": "127.0.0.1:1"}, timeout=2.0)).values()

    assert sample.info is None and "UNAVAILABLE" in (sample.error or "")


def test_stage_channels_serve_every_pass_over_one_stub_per_stage(
        workers: list[WorkerProcess]) -> None:
    endpoints = {"a": workers[0].endpoint, "b": workers[1].endpoint}

    async def passes() -> tuple[list[bool], bool]:
        channels = StageChannels()
        first = [await channels.stub(e) for e in endpoints.values()]
        answered = []
        for _ in range(3):
            samples = await sample_stages(endpoints, timeout=5.0, channels=channels)
            answered += [s.capacity is not None for s in samples.values()]
        last = [await channels.stub(e) for e in endpoints.values()]
        await channels.close()
        return answered, all(a is b for a, b in zip(first, last, strict=True))

    answered, same = asyncio.run(passes())
    assert answered == [True] * 6 and same


def test_a_stage_started_for_another_artifact_is_refused_and_reported_as_a_mismatch(
        shard_worker: Path, smollm2: Path, tmp_path: Path) -> None:
    theirs = "e" * 64
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="default/r1", epoch=1,
                        threads=1,
                        slots=4, ctx=256, metrics_listen="", manifest_digest=digest,
                        recipe_digest=RECIPE, route_digest=ROUTE)
             for span, digest in (((0, 15), MANIFEST), ((15, 30), theirs))]
    running = start_route(shard_worker, specs, tmp_path)
    try:
        endpoints = [w.endpoint for w in running]
        with RouteDriver(endpoints) as driver, pytest.raises(RouteRefused) as refused:
            driver.connect()
        names = {"s0": endpoints[0], "s1": endpoints[1]}
        answers = asyncio.run(sample_stages(names, timeout=5.0))
    finally:
        for worker in running:
            worker.stop()

    assert "stages disagree on the artifact (manifest digest)" in str(refused.value)
    stages = [StageView(name, begin, end, names[name], ready=True, started_at=1_000.0)
              for name, (begin, end) in (("s0", (0, 15)), ("s1", (15, 30)))]
    built = build_report(route_view(), stages, answers, lanes.state(lane(), certificate()),
                         provider=Provider(id="p1", cluster="c1"),
                         pin=PinFacts(llama_cpp_commit="0" * 40, patch_stack_digest="d" * 64),
                         sequence=1, now=1_060.0, first_seen={})
    assert [(r.reason, r.stage) for r in built.unavailable_reasons] == [("StageMismatch", "s1")]
    assert f"has manifest digest {theirs[:12]}, not {MANIFEST[:12]}" in \
        built.unavailable_reasons[0].message
    assert not built.available
