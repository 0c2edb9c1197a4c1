"""Speculative decoding through real SmolLM2 routes (1, 2 and 3 stages, hub, chain and
ring; on a route whose first stage loops, inside its loop, one verify window at a time or
several in flight): the tokens are exactly plain decoding's - greedy and sampled - drafts
on a repetitive prompt are accepted, every stage drops the rejected drafts' positions (and
skips the voided windows still waiting there), and a stage that restarts mid-generation is
recovered from with the same tokens."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.local.process import LaunchSpec, WorkerProcess, route_key_of, start_route
from meshnet.route import RouteDriver, Sampling, StageClient, StageError
from meshnet.route.proto import pb

from ..lanes import Lane, on_gpu

pytestmark = pytest.mark.slow

# Code that the model goes on repeating (edits of the same lines): prompt lookup drafts hold.
CODE = (
    "# Original:\ndef sum_list(values):\n    total = 0\n    for value in values:\n"
    "        total = total + value\n    return total\n\ndef mean(values):\n"
    "    total = sum_list(values)\n    return total / len(values)\n\n"
    "# The same code with type hints added:\ndef sum_list(values: list[float]) -> float:\n"
)
FREE = "Once upon a time, in a small village by the sea,"
TOKENS = 48
Reference = Callable[..., list[int]]


def start(binary: Path, model: Path, split: list[tuple[int, int]], logs: Path,
          ring: bool = False) -> list[WorkerProcess]:
    specs = [LaunchSpec(model=model, layers=LayerRange(*span), route_id="test/spec", threads=1,
                        ctx=512)
             for span in split]
    return start_route(binary, specs, logs, chain=True, ring=ring)


@pytest.fixture(scope="module")
def one_stage(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
              ) -> Iterator[list[WorkerProcess]]:
    workers = start(shard_worker, smollm2, [(0, 30)], tmp_path_factory.mktemp("spec1"))
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def two_stages(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[list[WorkerProcess]]:
    workers = start(shard_worker, smollm2, [(0, 15), (15, 30)], tmp_path_factory.mktemp("spec2"))
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def three_chained(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[list[WorkerProcess]]:
    workers = start(shard_worker, smollm2, [(0, 10), (10, 20), (20, 30)],
                    tmp_path_factory.mktemp("spec3"))
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture(scope="module")
def three_ringed(shard_worker: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[list[WorkerProcess]]:
    workers = start(shard_worker, smollm2, [(0, 10), (10, 20), (20, 30)],
                    tmp_path_factory.mktemp("spec3ring"), ring=True)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.fixture
def routes(one_stage: list[WorkerProcess], two_stages: list[WorkerProcess],
           three_chained: list[WorkerProcess], three_ringed: list[WorkerProcess],
           ) -> dict[str, list[WorkerProcess]]:
    return {"1": one_stage, "2": two_stages, "3": three_chained, "3 ringed": three_ringed}


def endpoints(workers: list[WorkerProcess]) -> list[str]:
    return [w.endpoint for w in workers]


def forward_calls(worker: WorkerProcess) -> float:
    """Forward calls the stage answered (a driver-verified step is one at the first)."""
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('meshnet_shard_requests_total{rpc="Forward",code="OK"'))


@pytest.mark.parametrize(("route", "topology"),
                         [("1", "auto"), ("2", "hub"), ("2", "chain"), ("3", "hub"),
                          ("3", "chain"), ("3 ringed", "ring")])
def test_greedy_tokens_are_plain_greedys_with_speculation(
    routes: dict[str, list[WorkerProcess]], reference: Reference, route: str, topology: str,
) -> None:
    """Where the first stage decodes by itself (one stage, chain, ring) it drafts and the
    last stage verifies inside its loop: the driver adds no step of its own."""
    workers = routes[route]
    with RouteDriver(endpoints(workers),
                     route_key=route_key_of(workers), topology=topology) as driver:
        for prompt in (CODE, FREE):
            before = forward_calls(workers[0])
            plain = driver.generate(prompt, max_tokens=TOKENS, stop_at_eos=False)
            between = forward_calls(workers[0])
            speculated = driver.generate(prompt, max_tokens=TOKENS, stop_at_eos=False,
                                         speculate=4)
            after = forward_calls(workers[0])
            pipelined = driver.generate(prompt, max_tokens=TOKENS, stop_at_eos=False,
                                        speculate=4, windows=3)
            assert speculated.speculate == 4
            assert speculated.tokens == plain.tokens == reference(plain.prompt_tokens, TOKENS)
            assert pipelined.tokens == plain.tokens
            assert pipelined.recoveries == 0
            assert speculated.recoveries == 0
            assert speculated.topology == {"chain": "chain", "ring": "ring"}.get(topology, "hub")
            assert speculated.decode_loop == (topology != "hub")
            if speculated.decode_loop:
                assert after - between == between - before  # the prefill's calls only
            if prompt is CODE:
                # the repetitive prompt: most drafted tokens hold, fewer steps than tokens
                assert speculated.acceptance_rate > 0.5, speculated.to_json()
                assert speculated.speculative_steps < TOKENS / 2
                # a loop keeps windows in flight on it; the hub verifies one at a time
                assert speculated.loop_depth <= 1
                assert (pipelined.loop_depth > 1) == speculated.decode_loop, pipelined.to_json()


def draft_counts(worker: WorkerProcess) -> dict[str, float]:
    """The last stage's meshnet_shard_draft_tokens_total by outcome."""
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5).read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("meshnet_shard_draft_tokens_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts


def test_the_last_stage_counts_the_drafts_it_verified_and_accepted(
    two_stages: list[WorkerProcess],
) -> None:
    before = draft_counts(two_stages[-1])
    with RouteDriver(endpoints(two_stages),
                     route_key=route_key_of(two_stages), topology="chain") as driver:
        speculated = driver.generate(CODE, max_tokens=TOKENS, stop_at_eos=False, speculate=4)
    after = draft_counts(two_stages[-1])
    assert speculated.accepted_draft_tokens > 0
    assert after["verified"] - before["verified"] == speculated.draft_tokens
    assert after["accepted"] - before["accepted"] == speculated.accepted_draft_tokens


def superseded_steps(workers: list[WorkerProcess]) -> float:
    """meshnet_shard_superseded_steps_total, summed over the stages."""
    total = 0.0
    for worker in workers:
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5).read().decode()
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("meshnet_shard_superseded_steps_total "))
    return total


def test_windows_voided_at_a_rejection_are_skipped_where_they_wait(
    three_ringed: list[WorkerProcess], reference: Reference,
) -> None:
    """Windows in flight: the first stage queues the later ones behind each other, so
    at a rejection some still wait there (or at a later stage); the step after the
    rejection makes them void, and they are not run (STEP_SUPERSEDED, which the loop
    ignores) - with plain decoding's tokens."""
    before = superseded_steps(three_ringed)
    with RouteDriver(endpoints(three_ringed),
                     route_key=route_key_of(three_ringed), topology="ring") as driver:
        pipelined = driver.generate(CODE, max_tokens=TOKENS, stop_at_eos=False,
                                    speculate=4, windows=5)
    assert pipelined.tokens == reference(pipelined.prompt_tokens, TOKENS)
    assert pipelined.recoveries == 0
    assert pipelined.loop_depth > 1, pipelined.to_json()
    assert superseded_steps(three_ringed) > before


@pytest.mark.parametrize(("route", "local", "windows"),
                         [("2", False, 1), ("2", True, 1), ("2", False, 4), ("3 ringed", False, 4)])
def test_sampled_tokens_are_plain_samplings_with_speculation(
    routes: dict[str, list[WorkerProcess]], route: str, local: bool, windows: int,
) -> None:
    """Positional draws make the accept/reject rule yield the very tokens plain sampling
    draws, in whatever order the windows run; the driver's own verification
    (--sample-locally) agrees with the worker's."""
    sampling = Sampling(temperature=0.7, top_k=40, top_p=0.95, seed=11)
    topology = "ring" if route == "3 ringed" else "chain"
    with RouteDriver(endpoints(routes[route]),
                     route_key=route_key_of(routes[route]), topology=topology,
                     sample_locally=local) as driver:
        plain = driver.generate(CODE, max_tokens=TOKENS, stop_at_eos=False, sampling=sampling)
        speculated = driver.generate(CODE, max_tokens=TOKENS, stop_at_eos=False,
                                     sampling=sampling, speculate=5, windows=windows)
    assert speculated.tokens == plain.tokens
    assert speculated.accepted_draft_tokens > 0


def hub_step(workers: list[WorkerProcess], session: str, tokens: list[int], n_past: int,
             output: pb.OutputRequest, discard: bool = False) -> list[pb.ForwardResponse]:
    """One step through every stage (the driver's hub), each stage's answer."""
    answers: list[pb.ForwardResponse] = []
    boundary = None
    clients = [StageClient(w.endpoint, route_key=route_key_of(workers)) for w in workers]
    for index, client in enumerate(clients):
        request = pb.ForwardRequest(
            key=pb.RouteKey(route_id="test/spec", epoch=1, session_id=session),
            n_past=n_past, positions=range(n_past, n_past + len(tokens)))
        if index == 0 or index == len(clients) - 1:
            request.tokens.extend(tokens)
        if boundary is not None:
            request.boundary.CopyFrom(boundary)
        if index == len(clients) - 1:
            request.output.CopyFrom(output)
        if discard:
            request.discard_from = n_past
        answers.append(client.forward(request))
        boundary = answers[-1].boundary
        client.close()
    return answers


def test_every_stage_drops_the_rejected_drafts_and_goes_on_as_plain_decoding(
    three_chained: list[WorkerProcess], reference: Reference,
) -> None:
    with RouteDriver(endpoints(three_chained), route_key=route_key_of(three_chained)) as driver:
        prompt = driver.tokenize(FREE)
    expected = reference(prompt, 3)
    n = len(prompt)
    verified = pb.OutputRequest(kind=pb.OUTPUT_KIND_VERIFIED)
    sampled = pb.OutputRequest(kind=pb.OUTPUT_KIND_SAMPLED)
    first = hub_step(three_chained, "discard", prompt, 0, sampled)[-1].sampled_tokens[0]
    assert first == expected[0]
    right, wrong = expected[1], (expected[2] + 1) % 49152
    answers = hub_step(three_chained, "discard", [first, right, wrong, wrong], n, verified)
    assert [a.n_past for a in answers] == [n + 4] * 3  # every row ran everywhere
    assert list(answers[-1].sampled_tokens) == [right, expected[2]]  # one held, a correction
    # The accepted tokens end at n + 2; positions n + 2 and n + 3 (the rejected) go.
    answers = hub_step(three_chained, "discard", [expected[2]], n + 2, verified, discard=True)
    assert [a.n_past for a in answers] == [n + 3] * 3
    assert list(answers[-1].sampled_tokens) == reference(prompt, 4)[3:]
    with pytest.raises(StageError) as refused:  # the stage holds what the step builds on only
        hub_step(three_chained, "discard", [1], n + 4, verified, discard=True)
    assert refused.value.reason == "CACHE_MISS"


@pytest.mark.parametrize("topology", ["hub", "chain", "ring"])
def test_a_stage_restarted_mid_generation_is_recovered_with_the_same_tokens(
    shard_worker: Path, smollm2: Path, tmp_path: Path, topology: str,
) -> None:
    """On the chain and the ring with windows in flight (pipelined): one recovery, the
    same text."""
    workers = start(shard_worker, smollm2, [(0, 15), (15, 30)], tmp_path,
                    ring=topology == "ring")
    try:
        with RouteDriver(endpoints(workers),
                         route_key=route_key_of(workers), topology=topology) as driver:
            expected = driver.generate(CODE, max_tokens=TOKENS, stop_at_eos=False)
            seen = [0]

            def restart_the_last_stage(_: int) -> None:
                seen[0] += 1
                if seen[0] == 12:
                    workers[1].kill()
                    threading.Timer(0.3, workers[1].start).start()

            speculated = driver.generate(CODE, max_tokens=TOKENS, stop_at_eos=False,
                                         speculate=4, windows=3,
                                         on_token=restart_the_last_stage)
        assert speculated.recoveries == 1
        assert speculated.tokens == expected.tokens
        assert speculated.accepted_draft_tokens > 0
    finally:
        for worker in workers:
            worker.stop()


@pytest.mark.parametrize("flag", [["--speculate"], ["--speculate", "6"]])
def test_meshnet_generate_speculates_with_the_acceptance_in_its_json(
    one_stage: list[WorkerProcess], reference: Reference, flag: list[str],
) -> None:
    meshnet = Path(sys.executable).parent / "meshnet"
    result = subprocess.run(
        [str(meshnet), "generate", "--stage", one_stage[0].endpoint, "--prompt", CODE,
         "--max-tokens", "32", "--ignore-eos", "--json", *flag,
         "--route-key-file", str(one_stage[0].spec.route_key_file)],
        capture_output=True, text=True, check=True, timeout=120)
    data = json.loads(result.stdout)
    assert data["speculate"] == (7 if len(flag) == 1 else 6)
    assert data["tokens"] == reference(data["prompt_tokens"], 32)
    assert 0 < data["accepted_draft_tokens"] <= data["draft_tokens"]
    assert data["acceptance_rate"] == round(
        data["accepted_draft_tokens"] / data["draft_tokens"], 4)


@pytest.fixture(scope="module")
def gpu_one_stage(lanes: Callable[[str], Lane], smollm2: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    """SmolLM2 unsplit with every layer on the GPU lane's device."""
    lane = lanes("gpu")
    spec = lane.spec(LaunchSpec(model=smollm2, layers=LayerRange(0, 30), route_id="test/spec",
                                threads=1, ctx=512))
    workers = start_route(lane.binary, [spec], tmp_path_factory.mktemp(f"spec1-{lane.name}"),
                          timeout=600)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.mark.parametrize("lane", ["cpu", on_gpu("gpu")])
@pytest.mark.parametrize("rows", [2, 5, 8])
def test_a_verification_steps_rows_are_bit_identical_to_one_token_steps(
    request: pytest.FixtureRequest, lane: str, rows: int,
) -> None:
    """Why speculation is exact: each row of a step of up to MAX_DRAFT + 1 rows has the
    logits a one-token decode step computes, to the bit, on the CPU lane and on the GPU
    lane's device (patches 0018-0020: its kernels chose their paths by row count)."""
    one_stage = request.getfixturevalue("one_stage" if lane == "cpu" else "gpu_one_stage")
    client = StageClient(one_stage[0].endpoint, route_key=route_key_of(one_stage))
    prompt = client.tokenize(CODE)
    following = client.tokenize(" return total\n\ndef mean(values):\n", add_special=False)[:rows]
    assert len(following) == rows

    def logits(session: str, n_past: int, tokens: list[int],
               last_only: bool = False) -> list[list[float]]:
        request = pb.ForwardRequest(
            key=pb.RouteKey(route_id="test/spec", epoch=1, session_id=session),
            n_past=n_past, positions=range(n_past, n_past + len(tokens)), tokens=tokens,
            output=pb.OutputRequest(kind=pb.OUTPUT_KIND_LOGITS,
                                    rows=[len(tokens) - 1] if last_only else range(len(tokens))))
        return [list(row.logits) for row in client.forward(request).rows]

    try:
        n = len(prompt)
        logits(f"one-{rows}", 0, prompt, last_only=True)  # the prompt's rows are not compared
        logits(f"all-{rows}", 0, prompt, last_only=True)
        alone = [logits(f"one-{rows}", n + i, [t])[0] for i, t in enumerate(following)]
        together = logits(f"all-{rows}", n, following)
        assert together == alone
    finally:
        for session in (f"one-{rows}", f"all-{rows}"):
            client.release(pb.RouteKey(route_id="test/spec", epoch=1, session_id=session))
        client.close()
