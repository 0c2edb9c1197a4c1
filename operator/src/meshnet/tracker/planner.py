"""A tracker daemon pass's outcome as a Plan (pure: the daemon observes, the executor acts):
the certification Job to start, and the status showing what the pass found, that is its
one condition (Certified), status.certification, status.tracker, status.speculation and
status.exactness.
The executor writes it like a reconcile's plan: the planner's conditions (Ready,
Progressing, Degraded) are kept as the route has them when the write lands."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from meshnet.api.tracker import CapacityReport, MeasuredCapacity, TrackerStatus, Unavailable
from meshnet.certify.decide import CERTIFIED, Decision
from meshnet.certify.job import JobInputs, certification_job
from meshnet.reconcile.conditions import as_status, stamp
from meshnet.reconcile.plan import Create, Event, Plan, Step

OWN_CONDITIONS = (CERTIFIED,)
STATUS_KEYS = ("certification", "tracker", "speculation", "exactness", "conditions")
ROUTE_WIDE = {"RouteNotReady": "the route is not Ready: see its Ready condition and stages",
              "RouteDeleted": "the route is being deleted"}


@dataclass(frozen=True)
class Shown:
    """What the pass shows in status besides its certification decision."""

    report: CapacityReport | None  # None: no report this pass (status.tracker is kept)
    delivery_error: str | None
    speculation: Mapping[str, Any] | None  # None: nothing observed (status.speculation goes)
    # What the stages measured to compute exactly; None: no stage answered (it is kept).
    exactness: Mapping[str, Any] | None = None


def plan_pass(body: Mapping[str, Any], decision: Decision, job: JobInputs | None, shown: Shown,
              now: datetime) -> Plan:
    """The pass's plan for the route `body`; `job` is what a certification Job is made of,
    given when the decision starts one and the stages it certifies are known."""
    status, meta = body.get("status") or {}, body.get("metadata") or {}
    previous = status.get("conditions") or []
    certified = as_status(stamp([decision.condition], previous, meta.get("generation"), now))
    wanted: dict[str, Any] = {
        "certification": decision.certificate.model_dump(mode="json", by_alias=True,
                                                         exclude_none=True)
        if decision.certificate else None,
        "tracker": _tracker_status(shown.report, shown.delivery_error) if shown.report
        else status.get("tracker"),
        "speculation": dict(shown.speculation) if shown.speculation else None,
        "exactness": dict(shown.exactness) if shown.exactness else status.get("exactness"),
    }
    shown_before = [c for c in previous if c.get("type") in OWN_CONDITIONS]
    changed = shown_before != certified or any(status.get(k) != v for k, v in wanted.items())
    new = {k: v for k, v in wanted.items() if v is not None} | {"conditions": certified}
    return Plan(steps=_start(job) if decision.create_job and job is not None else (),
                status=new if changed else None,
                conditions={CERTIFIED: certified[0]["status"]}, own_conditions=OWN_CONDITIONS)


def _start(job: JobInputs) -> tuple[Step, ...]:
    manifest = certification_job(job)
    return (Step(Create(manifest), Event(
        "Normal", "CertificationStarted",
        f"Job {manifest['metadata']['name']} certifies lane {job.lane.describe()}")),)


def _tracker_status(report: CapacityReport, delivery_error: str | None) -> dict[str, Any]:
    """What the report says, for status. Of a route that is not Ready (or going away) only
    that: which stage is doing what is in the route's own status, kept current by the
    reconcile, and repeating it here would rewrite status at every step of a rollout."""
    capacity = report.capacity.model_dump(exclude={"recent_tokens_per_second"})
    reasons = report.unavailable_reasons
    route_wide = [r for r in reasons if r.reason in ROUTE_WIDE]
    if route_wide:
        reasons = [Unavailable(reason=r.reason, message=ROUTE_WIDE[r.reason]) for r in route_wide]
    summary = TrackerStatus(available=report.available, unavailable_reasons=reasons,
                            capacity=None if route_wide else MeasuredCapacity(**capacity),
                            lane=report.certification.lane, delivery_error=delivery_error)
    return summary.model_dump(mode="json", by_alias=True, exclude_none=True)
