"""Which Job speaks for a copy, and when its bytes are hashed again (pure).

A pull skips files whose verified marker matches, and the marker checks only size and
mtime: bytes changed in place with the mtime put back would pass for ever. So every
`rehash_every` the planner starts a full re-hash Job (`meshnet artifact pull --full`) for
each verified copy; it hashes every byte and fetches again what no longer matches. Until
it finishes, the copy's status stays what the last finished Job reported: the copy's
record is the Job (provisioning or re-hash) whose latest attempt finished last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from meshnet.api.modelartifact import CopyVerification
from meshnet.reconcile.artifact.jobspec import rehash_round
from meshnet.reconcile.artifact.observed import ObservedJob
from meshnet.reconcile.artifact.status import VERIFIED
from meshnet.timestamps import parse_rfc3339, rfc3339

# A re-hash that failed for good (e.g. the source was gone while it refetched a damaged
# file) is tried again this soon, not a whole interval later.
RETRY_FAILED_REHASH = timedelta(hours=1)
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class CopyJobs:
    """The Jobs of one copy (one node's, or the PVC's) under the current spec."""

    provisioning: ObservedJob | None
    rehashes: tuple[ObservedJob, ...] = ()

    @property
    def record(self) -> ObservedJob | None:
        """The Job whose summary is the copy's state: the one that reported last; the
        provisioning Job while none has reported."""
        reported = [j for j in (self.provisioning, *self.rehashes)
                    if j is not None and j.summary is not None]
        if not reported:
            return self.provisioning
        return max(reported, key=lambda j: (j.finished_at, bool(j.rehash)))

    def superseded(self) -> list[ObservedJob]:
        """Re-hash Jobs that finished and no longer speak for the copy."""
        record = self.record
        return [j for j in self.rehashes if j is not record and j.phase in FINISHED]


def copy_jobs(jobs: Sequence[ObservedJob], provisioning: str, spec_hash: str,
              node: str | None) -> CopyJobs:
    return CopyJobs(
        next((j for j in jobs if j.name == provisioning), None),
        tuple(j for j in jobs if j.rehash and j.spec_hash == spec_hash and j.node == node))


def _verified(job: ObservedJob | None) -> bool:
    return job is not None and job.summary is not None and job.summary.get("result") == VERIFIED


def due_round(copy: CopyJobs, every: timedelta | None, now: datetime) -> str | None:
    """The round of the re-hash Job to start now, or None: one at a time, `every` after a
    verified check, RETRY_FAILED_REHASH after a re-hash that failed for good."""
    record = copy.record
    if every is None or record is None or record.phase not in FINISHED:
        return None
    if any(j.phase not in FINISHED for j in copy.rehashes):
        return None
    if _verified(record) and record.phase == "Succeeded":
        wait = every
    elif record.rehash and record.phase == "Failed":
        wait = min(every, RETRY_FAILED_REHASH)
    else:
        return None  # a provisioning Job that failed waits for a new spec, as before
    finished = parse_rfc3339(record.finished_at)
    if finished is None or now < finished + wait:
        return None
    round_ = rehash_round(record.finished_at)
    return None if any(j.rehash == round_ for j in copy.rehashes) else round_


def verification(copy: CopyJobs, every: timedelta | None) -> CopyVerification | None:
    """What the status says of a verified copy's last check; None for other copies."""
    record = copy.record
    if record is None or not _verified(record) or not record.finished_at:
        return None
    assert record.summary is not None
    finished = parse_rfc3339(record.finished_at)
    next_at = rfc3339(finished + every) \
        if finished is not None and every is not None else None
    return CopyVerification(checked_at=record.finished_at,
                            hashed_bytes=int(record.summary.get("bytesHashed", 0)),
                            marker_bytes=int(record.summary.get("bytesByMarker", 0)),
                            next_full_hash_at=next_at)


def repaired_bytes(copy: CopyJobs) -> int | None:
    """Bytes a finished, verified re-hash had to fetch again (None: the record is not one)."""
    record = copy.record
    if record is None or not record.rehash or not _verified(record):
        return None
    assert record.summary is not None
    return int(record.summary.get("bytesReceived", 0))
