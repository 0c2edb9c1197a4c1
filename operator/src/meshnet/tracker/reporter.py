"""One reporting step, shared by the operator's per-route daemon and `meshnet tracker
report`: sample the stages, build the report, send it when due."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.api.tracker import CapacityReport, CertificationState, Provider
from meshnet.tracker.client import Delivery, TrackerClient
from meshnet.tracker.collect import StageChannels, StageTls, sample_stages
from meshnet.tracker.inputs import PinFacts, ReplicaView, RouteView, StageSample, StageView
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.report import build_report, withdrawn
from meshnet.tracker.schedule import Cadence, fingerprint


@dataclass
class Reporting:
    """What every step of every route shares."""

    provider: Provider
    pin: PinFacts
    client: TrackerClient | None  # None: no Tracker configured (status is still written)
    metrics: TrackerMetrics
    stage_timeout: float = 2.0
    channels: StageChannels | None = None  # None: channels opened for each step


@dataclass(frozen=True)
class Stepped:
    """One step's outcome: the report as of now, the delivery when one was due (None
    otherwise), and what each stage answered (by stage name)."""

    report: CapacityReport
    delivery: Delivery | None
    samples: Mapping[str, StageSample]


async def step(reporting: Reporting, cadence: Cadence, route: RouteView,
               stages: Sequence[StageView], certification: CertificationState,
               replicas: Sequence[ReplicaView] | None = None,
               tls: StageTls | None = None) -> Stepped:
    """Sample the stages (and every replica's, each endpoint once; over mTLS with `tls`),
    build the report and send it when due. `replicas` None: the reporter does not know
    replicas."""
    endpoints = {s.endpoint for s in stages} | {
        s.endpoint for r in replicas or () for s in r.stages}
    answered = await sample_stages({e: e for e in endpoints if e}, reporting.stage_timeout,
                                   tls, channels=reporting.channels)
    samples = {s.name: answered[s.endpoint] for s in stages if s.endpoint}
    reporting.metrics.collect_errors.inc(sum(1 for s in answered.values() if s.error))
    now = time.time()
    first_seen = cadence.seen([s.info.incarnation for s in answered.values() if s.info], now)
    pipelines = None if replicas is None else [
        (r, {s.name: answered[s.endpoint] for s in r.stages if s.endpoint}) for r in replicas]
    report = build_report(route, stages, samples, certification, provider=reporting.provider,
                          pin=reporting.pin, sequence=cadence.sequence + 1, now=now,
                          first_seen=first_seen, replicas=pipelines)
    reporting.metrics.route_available((route.namespace, route.name),
                                      report.available and not route.deleting)
    print_ = fingerprint(report)
    if reporting.client is None or not cadence.due(print_, time.monotonic()):
        return Stepped(report, None, samples)
    cadence.next_sequence()
    delivery = await reporting.client.send(wire(report))
    if delivery.ok:
        cadence.delivered(print_, time.monotonic())
    return Stepped(report, delivery, samples)


async def withdraw(reporting: Reporting, cadence: Cadence, last: CapacityReport
                   ) -> Delivery | None:
    """Tell the Tracker a deleted route is gone (its last report, marked RouteDeleted)."""
    reporting.metrics.route_available((last.route.namespace, last.route.name), None)
    if reporting.client is None:
        return None
    report = withdrawn(last, sequence=cadence.next_sequence(), now=time.time())
    return await reporting.client.send(wire(report))


def wire(report: CapacityReport) -> dict[str, Any]:
    """The report as sent: without `replicas` where unknown, as before the field existed."""
    sent = report.model_dump(mode="json", by_alias=True)
    if sent.get("replicas") is None:
        sent.pop("replicas", None)
    return sent
