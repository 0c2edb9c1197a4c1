"""The benchmarks' drafter's file (worker/service/speculation/bench_oracle.h):
meshnet-shard-worker-bench, started with MESHNET_BENCH_ORACLE naming it, has its decode
loops draft the file's sequence
(a prompt's tokens, then a plain run's continuation), each draft the true token with
probability p. Each loop reads the file as it starts: rewrite it between runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

ORACLE_ENV = "MESHNET_BENCH_ORACLE"
BENCH_WORKER = "meshnet-shard-worker-bench"  # the build's binary that reads it (never installed)


def write_oracle(path: Path, p: float, sequence: Sequence[int], seed: int = 7) -> None:
    """p: the chance each draft is right (a coin fixed by the seed and the position)."""
    if not 0 <= p <= 1 or not sequence:
        raise ValueError(f"an oracle needs 0 <= p <= 1 and a sequence (got p={p}, "
                         f"{len(sequence)} tokens)")
    path.write_text(f"p={p},seed={seed}\n" + " ".join(map(str, sequence)) + "\n")
