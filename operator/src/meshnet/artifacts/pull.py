"""`meshnet artifact pull`: provision a ModelArtifact into a folder, resumably.

Per file: skip it when its verified marker matches (size and mtime, see markers.py);
otherwise fetch it into `NAME.partial` (resuming from the checkpoint journal, see
journal.py), hashing while writing; rename it into place only when the whole-file sha256
matches, else move the partial to quarantine and report HashMismatch naming the file and
both digests.
A file in place is only ever replaced by verified bytes, by one atomic rename once every
file of the pull is verified: a pull that fails leaves the files in place and their
markers as they were, so a spec with a wrong digest never takes a file from the workers
that run on it (they may be restarted from it any time).
Nothing is written outside the destination: names are checked first, and no symbolic
link in the destination is followed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import sys
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from meshnet.api.modelartifact import PULL_SUMMARY_KIND, ArtifactManifest
from meshnet.artifacts.facts import ModelFacts
from meshnet.artifacts.hashing import READ_BYTES, sha256_file
from meshnet.artifacts.journal import (
    Chunk,
    Journal,
    format_chunk,
    format_header,
    new_journal,
    parse_journal,
    plan_resume,
)
from meshnet.artifacts.markers import (
    Layout,
    check_file_names,
    fsync_dir,
    has_valid_marker,
    make_private_dir,
    marked_sha256,
    open_existing,
    open_new,
    write_atomic,
    write_marker,
)
from meshnet.artifacts.progress import Meter
from meshnet.artifacts.retry import RetryPolicy
from meshnet.artifacts.sources import ByteSource, TransientError
from meshnet.artifacts.spec import Artifact, ArtifactFile
from meshnet.artifacts.splitset import check_split_names
from meshnet.artifacts.storage import check_space, exclusive, refuse_home
from meshnet.artifacts.verify import MeterFactory, read_model_facts
from meshnet.errors import ArtifactError, DownloadFailed, HashMismatch, StorageRefused

VERIFIED = "Verified"


@dataclass
class FileOutcome:
    name: str
    size: int
    # skipped | verified | downloaded | resumed | failed, or staged: verified in its partial
    # to replace the file in place once every file is verified (the pull failed before)
    state: str = "pending"
    received: int = 0  # bytes that came from the source during this run
    resumed_from: int = 0  # bytes of an earlier partial reused after re-checking them
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "size": self.size,
            "state": self.state,
            "receivedBytes": self.received,
            "resumedFrom": self.resumed_from,
        }
        if self.error:
            entry["error"] = self.error
        return entry


@dataclass
class PullSummary:
    """What a pull did; its JSON form is what the operator turns into status (status.py)."""

    artifact: str
    manifest_digest: str
    dest: str
    files: list[FileOutcome] = field(default_factory=list)
    result: str = VERIFIED  # "Verified" or the failing error's reason
    message: str = ""
    retryable: bool = False
    facts: ModelFacts | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result == VERIFIED

    def to_json(self) -> dict[str, Any]:
        verified = [
            f for f in self.files if f.state in {"skipped", "verified", "downloaded", "resumed"}
        ]
        return {
            "kind": PULL_SUMMARY_KIND,
            "artifact": self.artifact,
            "manifestDigest": self.manifest_digest,
            "dest": self.dest,
            "result": self.result,
            "message": self.message,
            "retryable": self.retryable,
            "filesTotal": len(self.files),
            "filesVerified": len(verified),
            "bytesTotal": sum(f.size for f in self.files),
            "bytesVerified": sum(f.size for f in verified),
            "bytesReceived": sum(f.received for f in self.files),
            # Skipped files were trusted by their marker (size and mtime), not re-hashed.
            "bytesHashed": sum(f.size for f in verified if f.state != "skipped"),
            "bytesByMarker": sum(f.size for f in verified if f.state == "skipped"),
            "seconds": round(self.seconds, 3),
            "files": [f.to_json() for f in self.files],
            "gguf": self.facts.to_json() if self.facts else None,
        }


def compact_json(report: dict[str, Any], limit: int) -> str:
    """The summary in at most `limit` bytes (a termination message keeps 4096): per-file
    detail goes first, then the per-layer sizes, then the end of the message."""

    def dump(value: dict[str, Any]) -> str:
        return json.dumps(value, separators=(",", ":"))

    if len(dump(report).encode()) > limit:
        report = {**report, "files": []}
    if len(dump(report).encode()) > limit and report.get("gguf"):
        report["gguf"] = {k: v for k, v in report["gguf"].items() if k != "bytesPerLayer"}
    excess = len(dump(report).encode()) - limit
    if excess > 0:
        message = str(report.get("message", "")).encode()
        report["message"] = message[: max(0, len(message) - excess - 3)].decode(errors="ignore")
        report["message"] += "..."
    return dump(report)


@dataclass
class _Transfer:
    """One file's partial download: the open file, its journal and the running hashes."""

    file: ArtifactFile
    journal: Journal
    data: IO[bytes]
    log: IO[str]
    whole: hashlib._Hash = field(default_factory=hashlib.sha256)
    piece: hashlib._Hash = field(default_factory=hashlib.sha256)
    offset: int = 0
    piece_start: int = 0

    def write(self, block: bytes) -> None:
        self.data.write(block)
        self.whole.update(block)
        self.piece.update(block)
        self.offset += len(block)

    def checkpoint(self) -> None:
        """Make the bytes so far durable, then vouch for them in the journal."""
        self.data.flush()
        os.fsync(self.data.fileno())
        self.log.write(
            format_chunk(
                Chunk(self.piece_start, self.offset - self.piece_start, self.piece.hexdigest())
            )
        )
        self.log.flush()
        os.fsync(self.log.fileno())
        self.piece = hashlib.sha256()
        self.piece_start = self.offset


class Puller:
    def __init__(
        self,
        layout: Layout,
        source: ByteSource,
        meter: Meter,
        policy: RetryPolicy | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.layout = layout
        self.source = source
        self.meter = meter
        self.policy = policy or RetryPolicy()
        self.rng = rng or random.Random()
        self.sleep = sleep

    def fetch(self, file: ArtifactFile, outcome: FileOutcome) -> bool:
        """Bring one file into place verified, or raise the ArtifactError saying why not.
        False where it would replace a file in place: its verified bytes then wait in the
        partial until every file of the pull is verified (`place`)."""
        self.meter.describe(file.name)
        final = self.layout.final(file.name)
        info = _lstat(final)
        if info is not None and not stat.S_ISREG(info.st_mode):
            # A symbolic link may lead out of the destination: only a file in it is verified.
            self.meter.log(f"{file.name} is {_what(final)}: removing it and fetching the file"
                           " in its place, not following it")
            final.unlink()
        if final.is_file():
            # Not hashed where its marker vouches for other bytes: it is to be replaced.
            if final.stat().st_size == file.size \
                    and marked_sha256(self.layout, file.name) in (None, file.sha256) \
                    and sha256_file(final, self.meter) == file.sha256:
                self._seal(file)
                outcome.state = "verified"
                return True
            # Kept, with its marker, until verified bytes replace it: the spec may be wrong.
            self.meter.log(f"{file.name}: the file in place does not match: fetching it"
                           " again beside it")
        transfer = self._open(file, outcome)
        try:
            self._download(transfer, outcome)
            transfer.data.flush()
            os.fsync(transfer.data.fileno())
        finally:
            transfer.data.close()
            transfer.log.close()
        actual = transfer.whole.hexdigest()
        if actual != file.sha256:
            self._quarantine(self.layout.partial(file.name), file.name)
            self.layout.journal(file.name).unlink(missing_ok=True)
            raise HashMismatch(file.name, file.sha256, actual)
        if final.is_file():
            outcome.state = "staged"
            return False
        self.place(file, outcome)
        return True

    def place(self, file: ArtifactFile, outcome: FileOutcome) -> None:
        """Rename the verified partial over the file's name (a process that has the old
        file open keeps reading the old bytes)."""
        os.replace(self.layout.partial(file.name), self.layout.final(file.name))
        fsync_dir(self.layout.dest)
        self._seal(file)
        self.layout.journal(file.name).unlink(missing_ok=True)
        outcome.state = "resumed" if outcome.resumed_from else "downloaded"

    def _seal(self, file: ArtifactFile) -> None:
        if not write_marker(self.layout, file):
            raise StorageRefused(f"cannot write the verified marker in {self.layout.state}")

    def _quarantine(self, path: Path, name: str) -> None:
        # Downloaded bytes that did not verify (never the file in place), kept for
        # inspection, one per name so a flapping source cannot fill the disk.
        target = self.layout.quarantine(name)
        make_private_dir(target.parent)
        os.replace(path, target)

    def _open(self, file: ArtifactFile, outcome: FileOutcome) -> _Transfer:
        """Open the partial, re-check the checkpointed prefix from disk, and truncate after it."""
        partial = self.layout.partial(file.name)
        journal_path = self.layout.journal(file.name)
        try:
            journal = parse_journal(journal_path.read_text())
        except (OSError, UnicodeDecodeError):
            journal = None
        size = _own_size(partial)
        if size is None and _lstat(partial) is not None:
            self.meter.log(f"{partial.name} is {_what(partial)}: replacing it with a new file,"
                           " not writing through it")
        plan = plan_resume(file, journal, size)
        if size is not None:
            self.meter.log(f"{file.name}: {plan.why}")
        fresh = new_journal(file)
        keep: list[Chunk] = []
        data = open_existing(partial, "r+b") if size is not None else open_new(partial)
        whole = hashlib.sha256()
        for chunk in plan.reuse:
            checked = self._recheck(data, chunk, whole)
            if checked is None:
                self.meter.log(
                    f"{file.name}: checkpointed bytes at {chunk.offset:,} changed on "
                    "disk: downloading again from there"
                )
                break
            whole = checked
            keep.append(chunk)
        offset = keep[-1].end if keep else 0
        data.truncate(offset)
        data.seek(offset)
        start = Journal(
            fresh.name,
            fresh.size,
            fresh.sha256,
            journal.chunk_size if journal and keep else fresh.chunk_size,
            tuple(keep),
        )
        write_atomic(journal_path, format_header(start) + "".join(format_chunk(c) for c in keep))
        outcome.resumed_from = offset
        return _Transfer(
            file,
            start,
            data,
            open_existing(journal_path, "a"),
            whole=whole,
            offset=offset,
            piece_start=offset,
        )

    def _recheck(self, data: IO[bytes], chunk: Chunk, whole: hashlib._Hash) -> hashlib._Hash | None:
        """`whole` extended by the chunk's bytes on disk, or None if they are not the
        bytes the journal vouched for (read in pieces: a chunk may be 256 MiB)."""
        extended, piece = whole.copy(), hashlib.sha256()
        data.seek(chunk.offset)
        left = chunk.length
        while left:
            block = data.read(min(READ_BYTES, left))
            if not block:
                return None
            extended.update(block)
            piece.update(block)
            left -= len(block)
            self.meter.advance(len(block))
        return extended if piece.hexdigest() == chunk.sha256 else None

    def _download(self, transfer: _Transfer, outcome: FileOutcome) -> None:
        file = transfer.file
        failures = 0
        while transfer.offset < file.size:
            attempt_start = transfer.offset
            try:
                with closing(self.source.stream(file, transfer.offset)) as blocks:
                    for block in blocks:
                        self._take(transfer, block)
                        outcome.received += len(block)
                if transfer.offset < file.size:
                    raise TransientError(
                        f"transfer ended at byte {transfer.offset:,} of {file.size:,}"
                    )
            except TransientError as exc:
                failures = 1 if transfer.offset > attempt_start else failures + 1
                if self.policy.exhausted(failures):
                    raise DownloadFailed(
                        f"{file.name}: gave up after {failures} attempts without progress: {exc}"
                    ) from None
                delay = self.policy.delay(failures, self.rng)
                self.meter.log(
                    f"{file.name}: {exc}; retrying from byte {transfer.offset:,} in {delay:.1f}s"
                )
                self.sleep(delay)
        if transfer.offset > transfer.piece_start:
            transfer.checkpoint()

    def _take(self, transfer: _Transfer, block: bytes) -> None:
        file = transfer.file
        while block:
            room = transfer.journal.chunk_size - (transfer.offset - transfer.piece_start)
            head, block = block[:room], block[room:]
            if transfer.offset + len(head) > file.size:
                raise DownloadFailed(
                    f"{file.name}: the source has more than the manifest's {file.size:,} bytes"
                )
            transfer.write(head)
            self.meter.advance(len(head))
            if transfer.offset - transfer.piece_start == transfer.journal.chunk_size:
                transfer.checkpoint()


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


def _own_size(path: Path) -> int | None:
    """The size of a regular file at `path` that has no other name (a symbolic link is not
    followed; a hard link would make writes land in another file too), else None."""
    info = _lstat(path)
    if info is None or not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        return None
    return info.st_size


def _what(path: Path) -> str:
    """What is at `path` that is not a file of ours, in words."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if stat.S_ISREG(info.st_mode):
        return f"a file with {info.st_nlink} hard links"
    return "not a regular file"


def _reusable_bytes(layout: Layout, file: ArtifactFile) -> int:
    """Bytes of `file` already here: a file in place that may only need hashing (never one
    its marker says holds other bytes: that one stays while the new bytes come beside it),
    else a partial of its own."""
    info = _lstat(layout.final(file.name))
    if info is not None and stat.S_ISREG(info.st_mode) \
            and marked_sha256(layout, file.name) in (None, file.sha256):
        return min(info.st_size, file.size)
    return min(_own_size(layout.partial(file.name)) or 0, file.size)


def _fetch_all(files: list[ArtifactFile], outcomes: dict[str, FileOutcome], puller: Puller) -> None:
    first_mismatch: HashMismatch | None = None
    staged: list[ArtifactFile] = []
    for file in files:
        try:
            if not puller.fetch(file, outcomes[file.name]):
                staged.append(file)
        except ArtifactError as exc:
            outcomes[file.name].state = "failed"
            outcomes[file.name].error = str(exc)
            if not isinstance(exc, HashMismatch):
                raise  # the source or the storage is the problem: stop here
            # Only this file's bytes were bad: fetch the others, so a retry has less to do.
            puller.meter.log(str(exc))
            first_mismatch = first_mismatch or exc
    if first_mismatch:
        raise first_mismatch
    # Every file verified: only now are files in place replaced, so a pull that fails
    # leaves the copy it found whole (a set of changed splits never half-replaced).
    for file in staged:
        puller.place(file, outcomes[file.name])


def pull(
    artifact: Artifact[ArtifactManifest],
    dest: Path,
    source: ByteSource,
    meters: MeterFactory,
    policy: RetryPolicy | None = None,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
    full: bool = False,
) -> PullSummary:
    """Provision `artifact` into `dest`. Never raises ArtifactError: failures are in the summary.

    With `full`, verified markers are not trusted: every file in place is hashed again.
    """
    started = time.monotonic()
    spec = artifact.spec
    layout = Layout(dest)
    outcomes = {f.name: FileOutcome(f.name, f.size) for f in spec.files}
    summary = PullSummary(artifact.name, spec.manifest_digest(), str(dest), list(outcomes.values()))
    try:
        check_file_names(f.name for f in spec.files)
        refuse_home(dest)
        check_split_names([f.name for f in spec.files])
        try:
            make_private_dir(layout.state)
        except OSError as exc:
            raise StorageRefused(f"cannot create {layout.state}: {exc.strerror}") from None
        with exclusive(layout.state / "pull.lock", lambda: log_waiting(dest)):
            pending = []
            for file in spec.files:
                if not full and has_valid_marker(layout, file):
                    outcomes[file.name].state = "skipped"
                else:
                    pending.append(file)
            check_space(dest, sum(f.size - _reusable_bytes(layout, f) for f in pending))
            with meters(sum(f.size for f in pending), "pull") as meter:
                puller = Puller(layout, source, meter, policy, rng, sleep)
                _fetch_all(pending, outcomes, puller)
        summary.facts = read_model_facts(dest, [f.name for f in spec.files], spec.expectations)
        summary.message = f"{len(spec.files)} files, {spec.total_bytes():,} bytes in {dest}"
    except ArtifactError as exc:
        summary.result, summary.message, summary.retryable = exc.reason, str(exc), exc.retryable
    except OSError as exc:
        summary.result, summary.retryable = StorageRefused.reason, False
        summary.message = f"storage error at {dest}: {exc}"
    summary.seconds = time.monotonic() - started
    return summary


def log_waiting(dest: Path) -> None:
    print(f"another pull is writing into {dest}: waiting for it to finish", file=sys.stderr)
