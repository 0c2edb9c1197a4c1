"""The checkpoint of a partial download: per-chunk sha256 with offsets (pure format).

Python's sha256 state cannot be saved, so a whole-file digest cannot be resumed from a
checkpoint. The journal instead records, for every chunk made durable in
`NAME.partial`, its offset, length and sha256. A resumed pull re-reads that prefix from
local disk (never from the network), checks it chunk by chunk against the journal
while feeding the whole-file hash, truncates at the first chunk that does not match,
and downloads only from there on.

Format: one JSON header line naming the file it belongs to, then one line per chunk,
`OFFSET LENGTH SHA256`, appended (and fsynced) after the chunk's bytes are fsynced.
A torn last line is ignored, so a crash while appending costs at most one chunk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from meshnet.artifacts.spec import ArtifactFile

FORMAT_VERSION = 1
MIB = 1 << 20
# About a thousand chunks per file: bounded loss on a crash, bounded fsync rate.
MIN_CHUNK = 1 * MIB
MAX_CHUNK = 256 * MIB


def chunk_size_for(size: int) -> int:
    wanted = -(-size // 1024)
    rounded = -(-wanted // MIB) * MIB
    return max(MIN_CHUNK, min(MAX_CHUNK, rounded))


@dataclass(frozen=True)
class Chunk:
    offset: int
    length: int
    sha256: str

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Journal:
    name: str
    size: int
    sha256: str
    chunk_size: int
    chunks: tuple[Chunk, ...] = ()

    @property
    def covered(self) -> int:
        """Bytes from offset 0 that the journal vouches for."""
        return self.chunks[-1].end if self.chunks else 0

    def belongs_to(self, file: ArtifactFile) -> bool:
        return (self.name, self.size, self.sha256) == (file.name, file.size, file.sha256)


def new_journal(file: ArtifactFile) -> Journal:
    return Journal(file.name, file.size, file.sha256, chunk_size_for(file.size))


def format_header(journal: Journal) -> str:
    header = {
        "v": FORMAT_VERSION,
        "name": journal.name,
        "size": journal.size,
        "sha256": journal.sha256,
        "chunk": journal.chunk_size,
    }
    return json.dumps(header, sort_keys=True) + "\n"


def format_chunk(chunk: Chunk) -> str:
    return f"{chunk.offset} {chunk.length} {chunk.sha256}\n"


def parse_journal(text: str) -> Journal | None:
    """The journal in `text`, keeping only the contiguous chunks from offset 0;
    None when the header is unreadable (then the partial cannot be trusted)."""
    lines = text.split("\n")
    try:
        header = json.loads(lines[0])
        if header.get("v") != FORMAT_VERSION:
            return None
        journal = Journal(
            str(header["name"]), int(header["size"]), str(header["sha256"]), int(header["chunk"])
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    chunks: list[Chunk] = []
    # Every complete line ends with "\n": the last element is "" or a torn line.
    for line in lines[1:-1]:
        parts = line.split(" ")
        if (
            len(parts) != 3
            or not parts[0].isdigit()
            or not parts[1].isdigit()
            or len(parts[2]) != 64
        ):
            break
        chunk = Chunk(int(parts[0]), int(parts[1]), parts[2])
        if chunk.offset != (chunks[-1].end if chunks else 0) or chunk.end > journal.size:
            break
        chunks.append(chunk)
    return Journal(journal.name, journal.size, journal.sha256, journal.chunk_size, tuple(chunks))


@dataclass(frozen=True)
class ResumePlan:
    """What to do with an existing `NAME.partial` before downloading again."""

    reuse: tuple[Chunk, ...]  # re-read from disk and check against these, in order
    why: str  # for the log: why this much is reused

    @property
    def offset(self) -> int:
        return self.reuse[-1].end if self.reuse else 0


def plan_resume(
    file: ArtifactFile, journal: Journal | None, partial_size: int | None
) -> ResumePlan:
    if partial_size is None:
        return ResumePlan((), "no partial download")
    if journal is None or not journal.belongs_to(file):
        return ResumePlan((), "partial download without a matching checkpoint: starting over")
    if partial_size > file.size:
        return ResumePlan((), "partial download longer than the file: starting over")
    reuse = tuple(chunk for chunk in journal.chunks if chunk.end <= partial_size)
    if not reuse:
        return ResumePlan((), "no checkpointed chunk yet: starting over")
    return ResumePlan(reuse, f"resuming at byte {reuse[-1].end:,} of {file.size:,}")
