"""Certification of real routes against the unsplit reference started beside them: an
exact route passes, and each gate fails a route that does not meet it."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.certify.gates import Gates
from meshnet.certify.run import Reference, certify
from meshnet.local.process import LaunchSpec, start_route
from meshnet.route.stage import TlsFiles

from .conftest import LANE, SPEED_MEASURED_NOT_GATED, Route


def test_an_f32_route_matches_the_unsplit_reference_exactly_and_passes(
        start: Route, shard_worker: Path, smollm2: Path) -> None:
    workers = start("f32")

    certificate = certify([w.endpoint for w in workers], LANE,
                          Reference(shard_worker, smollm2, threads=1),
                          SPEED_MEASURED_NOT_GATED, epoch=1)

    assert certificate.passed and certificate.failures == []
    assert certificate.parity.max_abs_delta_logit == 0.0
    assert certificate.parity.greedy_match and certificate.parity.prompts == 4
    speed = certificate.speed
    assert speed.decode_tokens_per_second > 0 and speed.reference_decode_tokens_per_second > 0
    assert speed.fraction == pytest.approx(
        speed.decode_tokens_per_second / speed.reference_decode_tokens_per_second, abs=1e-3)
    assert certificate.lane == LANE and certificate.stages == 3


def test_an_impossible_speed_fraction_fails_the_lane_naming_the_figures(
        start: Route, shard_worker: Path, smollm2: Path) -> None:
    workers = start("f32")

    certificate = certify([w.endpoint for w in workers], LANE,
                          Reference(shard_worker, smollm2, threads=1),
                          Gates(speed_fraction=100.0, parity_steps=2, repeats=1))

    assert not certificate.passed
    assert certificate.parity.greedy_match  # parity itself holds: only speed fails
    [failure] = certificate.failures
    assert failure.startswith("speed: ") and "100 is required" in failure
    assert certificate.speed.required_fraction == 100.0


def test_an_f16_boundary_fails_parity_at_a_tight_tolerance(
        start: Route, shard_worker: Path, smollm2: Path) -> None:
    workers = start("f16")

    certificate = certify([w.endpoint for w in workers], LANE,
                          Reference(shard_worker, smollm2, threads=1),
                          Gates(tolerance=1e-3, repeats=1))

    assert not certificate.passed
    worst = certificate.parity.max_abs_delta_logit
    assert worst is not None and worst > 1e-3
    assert any(f.startswith("parity: max |delta logit|") for f in certificate.failures)


def test_a_route_served_over_mtls_is_certified_through_its_tls(
        shard_worker: Path, smollm2: Path, certificates: dict[str, Path]) -> None:
    tls = {"tls_cert": certificates["server.pem"], "tls_key": certificates["server.key"],
           "tls_client_ca": certificates["ca.pem"]}
    specs = [LaunchSpec(model=smollm2, layers=LayerRange(*span), route_id="test/certify", threads=1,
                        slots=2, ctx=512, metrics_listen="", **tls)
             for span in ((0, 15), (15, 30))]
    workers = start_route(shard_worker, specs)
    try:
        certificate = certify(
            [w.endpoint for w in workers], LANE, Reference(shard_worker, smollm2, threads=1),
            Gates(speed_fraction=SPEED_MEASURED_NOT_GATED.speed_fraction, parity_steps=4),
            epoch=1,
            tls=TlsFiles(ca=certificates["ca.pem"], cert=certificates["client.pem"],
                         key=certificates["client.key"]))
    finally:
        for worker in workers:
            worker.stop()

    assert certificate.passed and certificate.parity.max_abs_delta_logit == 0.0
    assert certificate.speed.decode_tokens_per_second > 0  # decoded through the mTLS route
    assert certificate.stages == 2
