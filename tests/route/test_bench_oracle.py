"""The benchmarks' drafter (meshnet-shard-worker-bench with MESHNET_BENCH_ORACLE, what
bench/wan_bench.py --acceptance runs): on a real 2-stage SmolLM2 ring its first stage's
decode loop proposes a plain run's continuation, each draft right with the set
probability, and the tokens stay plain decoding's. The served binary has no way to it:
neither the variable, nor a flag, nor a ShardRoute (recipe included) names it, and the
images do not hold the bench binary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.api.crd import crd_documents
from meshnet.api.shardroute import LayerRange
from meshnet.devtools.bench_oracle import BENCH_WORKER, ORACLE_ENV, write_oracle
from meshnet.local.process import (
    LaunchSpec,
    WorkerProcess,
    route_key_of,
    start_route,
    worker_binary,
)
from meshnet.native.bundle import BINARIES as BUNDLED
from meshnet.native.flags import worker_flags
from meshnet.route import RouteDriver

pytestmark = pytest.mark.slow

PROMPT = "The history of printing begins"
TOKENS = 48
DRAFTS = 6
WINDOWS = 4


def ring(binary: Path, model: Path, logs: Path, oracle: Path) -> list[WorkerProcess]:
    specs = [LaunchSpec(model=model, layers=LayerRange(*span), threads=1, ctx=512)
             for span in ((0, 15), (15, 30))]
    return start_route(binary, specs, logs, ring=True, env={ORACLE_ENV: str(oracle)})


@pytest.fixture(scope="module")
def oracle_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("oracle") / "oracle.txt"
    write_oracle(path, 0.0, [1])  # each loop reads it as it starts: valid from the first
    return path


@pytest.fixture(scope="module")
def bench_ring(smollm2: Path, oracle_file: Path, tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[list[WorkerProcess]]:
    workers = ring(worker_binary(name=BENCH_WORKER), smollm2,
                   tmp_path_factory.mktemp("oracle-bench"), oracle_file)
    yield workers
    for worker in workers:
        worker.stop()


@pytest.mark.parametrize("p", [0.5, 0.9])
def test_the_bench_drafter_holds_at_its_acceptance_and_changes_no_token(
    bench_ring: list[WorkerProcess], oracle_file: Path, p: float,
) -> None:
    with RouteDriver([w.endpoint for w in bench_ring], topology="ring",
                     route_key=route_key_of(bench_ring)) as driver:
        plain = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False)
        write_oracle(oracle_file, p, [*plain.prompt_tokens, *plain.tokens])
        drafted = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False,
                                  speculate=DRAFTS, windows=WINDOWS)
    assert drafted.tokens == plain.tokens
    assert drafted.recoveries == 0
    checked = drafted.accepted_draft_tokens + drafted.rejected_steps
    assert checked >= 24, drafted
    assert abs(drafted.token_acceptance - p) <= 0.15, drafted


def test_the_served_worker_ignores_the_bench_drafters_variable(
    shard_worker: Path, smollm2: Path, tmp_path: Path,
) -> None:
    """MESHNET_BENCH_ORACLE on meshnet-shard-worker: its drafts stay prompt lookup's,
    whatever acceptance the file asks for (one window at a time: the same each run)."""
    oracle = tmp_path / "oracle.txt"
    write_oracle(oracle, 0.0, [1])
    workers = ring(shard_worker, smollm2, tmp_path, oracle)
    try:
        with RouteDriver([w.endpoint for w in workers], topology="ring",
                         route_key=route_key_of(workers)) as driver:
            plain = driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False)
            runs = []
            for p in (0.0, 1.0):
                write_oracle(oracle, p, [*plain.prompt_tokens, *plain.tokens])
                runs.append(driver.generate(PROMPT, max_tokens=TOKENS, stop_at_eos=False,
                                            speculate=DRAFTS))
    finally:
        for worker in workers:
            worker.stop()
    never, always = runs
    assert never.tokens == always.tokens == plain.tokens
    assert ((never.draft_tokens, never.accepted_draft_tokens)
            == (always.draft_tokens, always.accepted_draft_tokens))
    assert always.token_acceptance < 1.0  # free text: prompt lookup misses
    assert ORACLE_ENV.encode() not in shard_worker.read_bytes()  # no code reads it


def test_no_flag_shardroute_field_or_image_has_the_bench_drafter(shard_worker: Path) -> None:
    flags = json.dumps([flag.name for flag in worker_flags(shard_worker)]).lower()
    schemas = json.dumps(crd_documents()).lower()
    for name in ("oracle", "bench"):
        assert name not in flags
        assert name not in schemas
    assert BENCH_WORKER not in BUNDLED  # the images hold the bundle's binaries alone
