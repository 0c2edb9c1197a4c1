"""What the operator decides about a route's certification on each pass, and what its
Certified condition says (pure: tracker/plan.py turns it into the pass's Plan)."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.api.certification import Certificate, CertifiedLane
from meshnet.certify.job import JobOutcome
from meshnet.certify.verdict import figures
from meshnet.reconcile.conditions import Verdict

CERTIFIED = "Certified"


@dataclass(frozen=True)
class Observation:
    lane: CertifiedLane | None  # None until the route has its identity and nodes
    route_ready: bool
    stored: Certificate | None  # status.certification
    request: str | None  # the route's recertify annotation
    job_exists: bool  # the Job for (lane, request)
    outcome: JobOutcome | None  # its result once it finished
    image: str | None  # the certification image for the lane
    job_name: str = ""


@dataclass(frozen=True)
class Decision:
    condition: Verdict  # the Certified condition
    certificate: Certificate | None  # what status.certification should hold
    create_job: bool = False


def decide(seen: Observation) -> Decision:
    lane, stored = seen.lane, seen.stored
    if lane is None:
        return Decision(_not("CertificationPending",
                             "waiting for the route's identity and the nodes of its stages"),
                        stored)
    if stored is not None and stored.lane == lane and stored.request == seen.request:
        return Decision(judged(stored), stored)
    if seen.job_exists and seen.outcome is not None and seen.outcome.finished:
        found = seen.outcome.certificate
        if found is not None and found.lane == lane:
            return Decision(judged(found), found.model_copy(update={"request": seen.request}))
        why = seen.outcome.error if found is None else (
            f"it certified lane {found.lane.describe()}, not {lane.describe()}")
        return Decision(_not("CertificationError",
                             f"certification Job {seen.job_name} gave no certificate for lane"
                             f" {lane.describe()}: {why} (delete the Job, or set a new"
                             f" meshnet.dev/recertify annotation, to run it again)"), stored)
    if seen.job_exists:
        return Decision(_not("CertificationRunning",
                             f"Job {seen.job_name} is certifying lane {lane.describe()}"), stored)
    if not seen.route_ready:
        return Decision(_not("CertificationPending",
                             f"lane {lane.describe()} is certified once the route is Ready"),
                        stored)
    if not seen.image:
        return Decision(_not("NoCertifier",
                             f"no certification image for lane {lane.backend} (chart value"
                             f" certify.images.{lane.backend}); lane {lane.describe()} stays"
                             " unadvertised"), stored)
    return Decision(_not("CertificationRunning",
                         f"starting Job {seen.job_name} to certify lane {lane.describe()}"),
                    stored, create_job=True)


def _not(reason: str, message: str) -> Verdict:
    return Verdict(CERTIFIED, False, reason, message)


def judged(certificate: Certificate) -> Verdict:
    """The condition a finished certificate of the current lane gives."""
    lane, at = certificate.lane.describe(), certificate.certified_at
    if certificate.passed:
        return Verdict(CERTIFIED, True, "LaneCertified",
                       f"lane {lane} certified at {at}: {figures(certificate)}")
    return _not("CertificationFailed",
                f"lane {lane} failed {', '.join(certificate.reasons)} at {at}: "
                + "; ".join(certificate.failures))
