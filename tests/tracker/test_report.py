"""The report says available only for a certified lane with every stage healthy, lists
every reason otherwise, and always validates against the published schema."""

from __future__ import annotations

from typing import Any

from meshnet.api.certification import Certificate
from meshnet.api.shardroute import Recipe
from meshnet.api.tracker import CapacityReport, Provider
from meshnet.certify import lane as lanes
from meshnet.tracker.inputs import PinFacts, ReplicaView, RouteView, StageSample, StageView
from meshnet.tracker.report import build_report, withdrawn
from meshnet.tracker.reporter import wire as sent
from meshnet.tracker.validate import report_errors

from .conftest import certificate, lane, route_view, samples, stage_views

NOW = 1_060.0
PIN = PinFacts(llama_cpp_commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f",
               patch_stack_digest="d" * 64)


def report(route: RouteView | None = None, stages: list[StageView] | None = None,
           answers: dict[str, StageSample] | None = None,
           cert: Certificate | None = None,
           replicas: list[tuple[ReplicaView, dict[str, StageSample]]] | None = None
           ) -> CapacityReport:
    built = build_report(route or route_view(), stages or stage_views(),
                         samples() if answers is None else answers,
                         lanes.state(lane(), cert), provider=Provider(id="p1", cluster="c1"),
                         pin=PIN, sequence=7, now=NOW, first_seen={}, replicas=replicas)
    assert report_errors(wire(built)) == []  # every report, whatever it says
    assert report_errors(sent(built)) == []
    return built


def wire(built: CapacityReport) -> dict[str, Any]:
    return built.model_dump(mode="json", by_alias=True)


def reasons(built: CapacityReport) -> list[tuple[str, str | None]]:
    return [(r.reason, r.stage) for r in built.unavailable_reasons]


def test_a_certified_route_with_every_stage_healthy_is_available_with_its_free_slots() -> None:
    built = report(cert=certificate())

    assert built.available and built.unavailable_reasons == []
    assert built.capacity.session_slots_advertised == 3  # the fullest stage has 3 free
    assert (built.capacity.kv_tokens_free, built.capacity.queue_depth) == (7992, 2)
    stage = built.stages[0]
    assert (stage.seam.boundary_bytes_per_token if stage.seam else None) == 576 * 4
    assert built.stages[-1].seam is not None and built.stages[-1].seam.boundary_bytes_per_token == 0
    assert stage.health.uptime_seconds == 60.0 and stage.health.incarnation == "inc0"
    assert wire(built)["recipe"]["llamaCppCommit"] == PIN.llama_cpp_commit


def test_a_throughput_route_tells_the_tracker_its_tokens_may_depend_on_the_load() -> None:
    throughput = report(route_view(recipe=Recipe(context_length=2048, session_slots=4,
                                                  batching="Throughput")), cert=certificate())
    assert wire(throughput)["recipe"]["batching"] == "Throughput"
    assert wire(report(cert=certificate()))["recipe"]["batching"] == "Exact"


def test_an_uncertified_lane_is_not_available_and_advertises_nothing() -> None:
    built = report(cert=None)

    assert not built.available
    assert reasons(built) == [("LaneNotCertified", None)]
    assert "has no certificate" in built.unavailable_reasons[0].message
    assert built.capacity.session_slots_advertised == 0
    assert built.capacity.session_slots_free == 3  # measured figures stay honest


def test_a_certificate_of_another_recipe_does_not_certify_the_route() -> None:
    built = report(cert=certificate(recipe_digest="e" * 64))

    assert not built.available and not built.certification.passed
    assert reasons(built) == [("LaneNotCertified", None)]
    assert "recipeDigest eeeeeeeeeeee -> bbbbbbbbbbbb" in built.unavailable_reasons[0].message


def test_a_certificate_of_another_gpu_product_does_not_certify_the_route() -> None:
    built = report(cert=certificate(gpu_product="NVIDIA-H100-80GB-HBM3"))

    assert reasons(built) == [("LaneNotCertified", None)]


def test_a_failed_certificate_makes_the_route_unavailable_with_its_reasons() -> None:
    built = report(cert=certificate(passed=False))

    assert reasons(built) == [("CertificationFailed", None)]
    assert "100 is required" in built.unavailable_reasons[0].message
    assert built.certification.certificate is not None
    assert not built.certification.certificate.passed


def test_an_unreachable_stage_makes_the_route_unavailable_naming_the_stage() -> None:
    answers = samples()
    answers["s1"] = StageSample("127.0.0.3:5000", error="DEADLINE_EXCEEDED: Deadline Exceeded")

    built = report(answers=answers, cert=certificate())

    assert reasons(built) == [("StageUnreachable", "s1")]
    assert "DEADLINE_EXCEEDED" in built.unavailable_reasons[0].message
    assert built.stages[1].capacity is None and not built.stages[1].health.reachable
    assert built.capacity.session_slots_free is None
    assert built.capacity.session_slots_advertised == 0


def test_a_fleet_reports_the_sum_of_its_whole_replicas_and_lists_each() -> None:
    """Replica 1 is still served by epoch 0 (a rollout has not reached it): judged at its
    own epoch, it counts. Replica 2 has a stage that does not answer: listed, not counted."""
    broken = samples()
    broken["s2"] = StageSample("127.0.0.4:5000", error="UNAVAILABLE: connection refused")
    replicas = [(ReplicaView(0, 1, stage_views()), samples()),
                (ReplicaView(1, 0, stage_views()), samples(epoch=0)),
                (ReplicaView(2, 1, stage_views()), broken)]

    built = report(cert=certificate(), replicas=replicas)

    assert built.available
    assert [(r.replica, r.epoch, r.ready, r.session_slots_free) for r in built.replicas or []] \
        == [(0, 1, True, 3), (1, 0, True, 3), (2, 1, False, None)]
    assert "UNAVAILABLE" in (built.replicas or [])[2].problem  # type: ignore[operator]
    capacity = built.capacity
    assert (capacity.session_slots_advertised, capacity.session_slots_total,
            capacity.active_sessions, capacity.kv_tokens_free) == (6, 8, 2, 2 * 7992)
    assert "replicas" not in sent(report(cert=certificate()))  # unknown: not on the wire


def test_a_replica_answering_for_another_epoch_than_its_own_is_not_counted() -> None:
    built = report(cert=certificate(),
                   replicas=[(ReplicaView(0, 1, stage_views()), samples()),
                             (ReplicaView(1, 0, stage_views()), samples(epoch=1))])

    assert [r.ready for r in built.replicas or []] == [True, False]
    assert built.capacity.session_slots_advertised == 3


def test_a_worker_of_another_epoch_is_a_stage_mismatch() -> None:
    built = report(answers=samples(epoch=2), cert=certificate())

    assert {r for r, _ in reasons(built)} == {"StageMismatch"}
    assert "is at epoch 2, the route at 1" in built.unavailable_reasons[0].message


def test_a_route_that_is_not_ready_is_not_available_even_when_certified() -> None:
    built = report(route=route_view(ready=False, not_ready="2/3 stages ready at epoch 1"),
                   stages=[*stage_views()[:2], StageView("s2", 20, 30, None,
                                                         problem="no pod at this epoch")],
                   cert=certificate())

    assert reasons(built) == [("RouteNotReady", None), ("StageNotReady", "s2")]


def test_a_deleted_route_is_withdrawn() -> None:
    built = report(route=route_view(deleting=True), cert=certificate())

    assert reasons(built) == [("RouteDeleted", None)]


def test_the_schema_refuses_a_report_that_claims_available_without_a_certificate() -> None:
    forged = wire(report(cert=None))
    forged["available"] = True

    errors = report_errors(forged)

    assert any("unavailableReasons" in e for e in errors)
    assert any("certification/passed" in e for e in errors)


def test_the_schema_refuses_an_unavailable_report_that_advertises_sessions() -> None:
    forged = wire(report(cert=None))
    forged["capacity"]["sessionSlotsAdvertised"] = 3

    assert any("sessionSlotsAdvertised" in e for e in report_errors(forged))


def test_a_deleted_routes_last_report_becomes_its_withdrawal() -> None:
    last = report(cert=certificate())

    gone = withdrawn(last, sequence=8, now=NOW + 5)

    assert not gone.available and reasons(gone) == [("RouteDeleted", None)]
    assert gone.capacity.session_slots_advertised == 0 and gone.sequence == 8
    assert gone.stages == last.stages
    assert report_errors(wire(gone)) == []
