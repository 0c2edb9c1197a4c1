"""The partial-download checkpoint: its format, torn lines, and resume planning."""

from __future__ import annotations

import hashlib

from meshnet.api.modelartifact import ArtifactFile
from meshnet.artifacts.journal import (
    MIB,
    Chunk,
    chunk_size_for,
    format_chunk,
    format_header,
    new_journal,
    parse_journal,
    plan_resume,
)

FILE = ArtifactFile(name="m.gguf", size=5 * MIB + 7, sha256="c" * 64)


def journal_text(chunks: int, torn: str = "") -> str:
    journal = new_journal(FILE)
    body = "".join(
        format_chunk(Chunk(i * MIB, MIB, hashlib.sha256(bytes([i])).hexdigest()))
        for i in range(chunks)
    )
    return format_header(journal) + body + torn


def test_chunks_are_about_a_thousandth_of_the_file_within_bounds():
    assert chunk_size_for(10) == MIB
    assert chunk_size_for(100 * MIB) == MIB
    assert chunk_size_for(50 * 1024 * MIB) == 50 * MIB
    assert chunk_size_for(10 * 1024 * 1024 * MIB) == 256 * MIB


def test_a_journal_round_trips_and_covers_its_contiguous_chunks():
    journal = parse_journal(journal_text(3))

    assert journal is not None and journal.belongs_to(FILE)
    assert journal.covered == 3 * MIB


def test_a_torn_last_line_is_ignored():
    journal = parse_journal(journal_text(2, torn=f"{2 * MIB} {MIB} abc"))

    assert journal is not None and journal.covered == 2 * MIB


def test_chunks_after_a_gap_are_not_trusted():
    text = journal_text(1) + format_chunk(Chunk(2 * MIB, MIB, "d" * 64))

    journal = parse_journal(text)

    assert journal is not None and journal.covered == MIB


def test_an_unreadable_header_means_no_journal():
    assert parse_journal("") is None
    assert parse_journal("not json\n0 1 " + "a" * 64 + "\n") is None
    assert parse_journal('{"v": 99, "name": "m.gguf"}\n') is None


def test_resume_plan_without_a_partial_starts_at_zero():
    assert plan_resume(FILE, parse_journal(journal_text(3)), None).offset == 0


def test_resume_plan_reuses_the_chunks_the_partial_still_holds():
    plan = plan_resume(FILE, parse_journal(journal_text(3)), 2 * MIB + 100)

    assert plan.offset == 2 * MIB
    assert [c.offset for c in plan.reuse] == [0, MIB]


def test_resume_plan_distrusts_a_journal_of_another_file():
    other = ArtifactFile(name="m.gguf", size=FILE.size, sha256="e" * 64)

    plan = plan_resume(other, parse_journal(journal_text(3)), 3 * MIB)

    assert plan.offset == 0 and "checkpoint" in plan.why


def test_resume_plan_distrusts_a_partial_longer_than_the_file():
    plan = plan_resume(FILE, parse_journal(journal_text(3)), FILE.size + 1)

    assert plan.offset == 0
