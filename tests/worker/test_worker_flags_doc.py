"""docs/worker-flags.md is written from the code it describes (`meshnet worker flags`): the
bounds the worker lists are the ones its parser keeps, and the prose must say where every
flag the renderer passes comes from."""

from __future__ import annotations

import subprocess
from pathlib import Path

from meshnet.cli.worker import run_cmd
from meshnet.cli.worker_doc import RENDERED_SECTION, passes_text, rendered_flags, unexplained
from meshnet.native.flags import DOC, worker_flags
from meshnet.paths import repo_root


def _accepted(binary: Path, flag: str, value: int) -> bool:
    checked = subprocess.run([str(binary), "--check-args", "--model", "m.gguf", flag, str(value)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode in (0, 2), checked.stderr
    return checked.returncode == 0


def test_every_number_lists_the_bounds_the_worker_s_parser_keeps(shard_worker: Path) -> None:
    numbers = [flag for flag in worker_flags(shard_worker) if flag.metavar in ("N", "PID")]
    assert numbers and all(flag.min is not None for flag in numbers), \
        [flag.name for flag in numbers if flag.min is None]
    for flag in numbers:
        assert flag.min is not None
        assert _accepted(shard_worker, flag.name, flag.min), flag
        assert not _accepted(shard_worker, flag.name, flag.min - 1), flag
        if flag.max is not None:
            assert _accepted(shard_worker, flag.name, flag.max), flag
            assert not _accepted(shard_worker, flag.name, flag.max + 1), flag


def test_worker_run_passes_through_the_worker_flags_it_has_no_option_for(
    shard_worker: Path,
) -> None:
    passed, own = passes_text(run_cmd, worker_flags(shard_worker)).split("\n\n")
    assert "`--prefix-cache-entries`" in passed and "`--stream-flush-ms`" in passed
    assert "`--slots`" not in passed and "`--local-relay`" not in passed  # options of its own
    assert own == "Its own, not the worker's: `--cpus`, `--dev`, `--lane`.\n"


def test_the_renderer_s_flags_are_each_explained_and_a_dropped_word_is_caught() -> None:
    doc = (repo_root() / DOC).read_text()
    assert {"--route-key-file", "--drafter-model", "--ring-last", "--batching"} <= rendered_flags()
    assert unexplained(doc) == []
    head, section, tail = doc.partition(RENDERED_SECTION)
    prose = tail.replace("`--prefix-block`", "the block")
    assert unexplained(head + section + prose) == ["--prefix-block"]
