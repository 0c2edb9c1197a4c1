"""A SmolLM2 route of three real workers generates exactly what the unsplit model
generates: greedy, sampled (server- or driver-side), alone or concurrently, and through
`meshnet generate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, RouteRefused, Sampling, StageClient

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
]
Reference = Callable[..., list[int]]


@pytest.fixture(scope="module")
def driver(three_stages: list[WorkerProcess]) -> RouteDriver:
    route = RouteDriver([w.endpoint for w in three_stages], route_key=route_key_of(three_stages))
    route.connect(wait=30)
    return route


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_split_route_generates_the_unsplit_models_64_greedy_tokens(
    driver: RouteDriver, reference: Reference, prompt: str,
) -> None:
    generation = driver.generate(prompt, max_tokens=64, stop_at_eos=False)
    assert len(generation.tokens) == 64
    assert generation.tokens == reference(generation.prompt_tokens, 64)
    assert generation.recoveries == 0
    assert generation.text == driver.detokenize(generation.tokens)


@pytest.mark.slow
def test_the_chained_route_generates_the_unsplit_models_tokens(
    three_stages_chained: list[WorkerProcess], reference: Reference,
) -> None:
    with RouteDriver([w.endpoint for w in three_stages_chained],
                     route_key=route_key_of(three_stages_chained)) as chained:
        generation = chained.generate(PROMPTS[1], max_tokens=64, stop_at_eos=False)
        hub = RouteDriver([w.endpoint for w in three_stages_chained],
                          route_key=route_key_of(three_stages_chained), topology="hub")
        via_hub = hub.generate(PROMPTS[1], max_tokens=64, stop_at_eos=False)
        hub.close()
    assert generation.topology == "chain"
    assert via_hub.topology == "hub"
    assert generation.tokens == reference(generation.prompt_tokens, 64) == via_hub.tokens
    for run in (generation, via_hub):  # the stages' engine time is part of the decode's
        assert 0 < run.decode_engine_seconds < run.decode_seconds


def test_chain_topology_is_refused_for_workers_without_a_next_stage(
    three_stages: list[WorkerProcess],
) -> None:
    with RouteDriver([w.endpoint for w in three_stages],
                     route_key=route_key_of(three_stages), topology="chain") as driver, \
            pytest.raises(RouteRefused):
        driver.connect()


def test_a_long_prompt_prefilled_in_chunks_gives_the_same_tokens(
    driver: RouteDriver, reference: Reference,
) -> None:
    prompt = " ".join(PROMPTS * 6)
    driver.chunk_tokens = 16
    try:
        generation = driver.generate(prompt, max_tokens=16, stop_at_eos=False)
    finally:
        driver.chunk_tokens = None
    assert len(generation.prompt_tokens) > 48
    assert generation.tokens == reference(generation.prompt_tokens, 16)
    # one thread per stage: unless this host has a single CPU, the stages compute at once
    assert generation.prefill_wavefront == (len(os.sched_getaffinity(0)) > 1)


def test_stages_that_take_turns_on_the_cpus_prefill_chunk_after_chunk(
    shard_worker: Path, smollm2: Path, reference: Reference, tmp_path: Path,
) -> None:
    cpus = tuple(sorted(os.sched_getaffinity(0))[:2])
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), threads=len(cpus), cpus=cpus)
             for span in ((0, 15), (15, 30))]
    workers = start_route(shard_worker, specs, tmp_path, chain=True)
    try:
        with RouteDriver([w.endpoint for w in workers], route_key=route_key_of(workers)) as driver:
            whole = driver.generate(" ".join(PROMPTS * 6), max_tokens=8, stop_at_eos=False)
            driver.chunk_tokens = 32  # chunk after chunk through the chain
            chunked = driver.generate(" ".join(PROMPTS * 6), max_tokens=8, stop_at_eos=False)
            takes_turns = driver.route.stages_take_turns
    finally:
        for worker in workers:
            worker.stop()
    assert takes_turns
    assert len(whole.prompt_tokens) > 64  # a wavefront would have taken 2 chunks
    assert not whole.prefill_wavefront and not chunked.prefill_wavefront
    assert whole.tokens == chunked.tokens == reference(whole.prompt_tokens, 8)


def test_seeded_sampling_matches_the_unsplit_model_on_either_side(
    driver: RouteDriver, reference: Reference,
) -> None:
    sampling = Sampling(temperature=0.8, top_k=40, top_p=0.95, seed=1234)
    on_stage = driver.generate(PROMPTS[2], max_tokens=32, sampling=sampling, stop_at_eos=False)
    driver.sample_locally = True
    try:
        here = driver.generate(PROMPTS[2], max_tokens=32, sampling=sampling, stop_at_eos=False)
    finally:
        driver.sample_locally = False
    assert on_stage.tokens == here.tokens
    expected = reference(on_stage.prompt_tokens, 32, "--temperature", "0.8", "--top-k", "40",
                         "--top-p", "0.95", "--seed", "1234")
    assert on_stage.tokens == expected
    other_seed = driver.generate(PROMPTS[2], max_tokens=32, stop_at_eos=False,
                                 sampling=Sampling(temperature=0.8, top_k=40, top_p=0.95, seed=9))
    assert other_seed.tokens != on_stage.tokens


def test_concurrent_sessions_each_get_their_own_tokens(driver: RouteDriver) -> None:
    alone = [driver.generate(p, max_tokens=24, stop_at_eos=False).tokens for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(
            lambda p: driver.generate(p, max_tokens=24, stop_at_eos=False).tokens, PROMPTS))
    assert together == alone


def test_every_cut_of_non_latin_and_emoji_text_detokenizes_to_whole_characters(
        driver: RouteDriver, three_stages: list[WorkerProcess]) -> None:
    """A token can end inside a multi-byte character; Detokenize must still answer valid
    UTF-8 (a proto3 string), holding the unfinished character back."""
    text = "Привет, мир! 你好, 世界。🙂👍🏽 done"
    vocab = StageClient(three_stages[-1].endpoint)
    tokens = vocab.tokenize(text, add_special=False)
    assert len(vocab.tokenize("🙂", add_special=False)) > 1  # the emoji is cut between tokens
    cuts = [driver.detokenize(tokens[:n]) for n in range(len(tokens) + 1)]
    assert cuts[-1] == text
    assert all(text.startswith(cut) and "\ufffd" not in cut for cut in cuts)


class _CallerGone(Exception):
    pass


def test_a_generation_its_caller_stops_frees_the_session_on_every_stage(
        driver: RouteDriver, three_stages: list[WorkerProcess]) -> None:
    def stop_after_three(token: int, seen: list[int] = []) -> None:  # noqa: B006
        seen.append(token)
        if len(seen) == 3:
            raise _CallerGone

    with pytest.raises(_CallerGone):
        driver.generate(PROMPTS[0], max_tokens=50, stop_at_eos=False, on_token=stop_after_three)
    free = [StageClient(w.endpoint).capacity() for w in three_stages]
    assert [c.slots_free for c in free] == [c.slots_total for c in free]


def test_generation_stops_at_the_end_of_generation_token(driver: RouteDriver) -> None:
    generation = driver.generate(
        "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n", max_tokens=200)
    assert generation.stop_reason == "eos"
    assert generation.tokens[-1] in driver.route.eos_token_ids


def test_meshnet_generate_prints_text_tokens_timings_and_recoveries(
    three_stages: list[WorkerProcess], driver: RouteDriver,
) -> None:
    meshnet = Path(sys.executable).parent / "meshnet"
    stages = [arg for w in three_stages for arg in ("--stage", w.endpoint)]
    result = subprocess.run(
        [str(meshnet), "generate", *stages, "--prompt", PROMPTS[0], "--max-tokens", "12",
         "--ignore-eos", "--json"], capture_output=True, text=True, check=True, timeout=120,
    )
    data = json.loads(result.stdout)
    expected = driver.generate(PROMPTS[0], max_tokens=12, stop_at_eos=False)
    assert data["tokens"] == expected.tokens
    assert data["text"] == expected.text
    assert data["recoveries"] == 0
    assert data["decode_tokens_per_second"] > 0
    assert [s["layers"] for s in data["route"]["stages"]] == [[0, 10], [10, 20], [20, 30]]

    streamed = subprocess.run(
        [str(meshnet), "generate", *stages, "--prompt", PROMPTS[0], "--max-tokens", "12",
         "--ignore-eos"], capture_output=True, text=True, check=True, timeout=120,
    )
    assert streamed.stdout.rstrip("\n") == expected.text
    assert "generated at" in streamed.stderr
