"""Certification of real routes against the unsplit reference started beside them: an
exact route passes, and each gate fails a route that does not meet it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from meshnet.api.shardroute import LayerRange
from meshnet.certify.gates import Gates
from meshnet.certify.run import Reference, certify
from meshnet.local.process import LaunchSpec, start_route
from meshnet.route.stage import TlsFiles

from ..lanes import Lane
from .conftest import LANE, SPEED_MEASURED_NOT_GATED, Route

# Patch 0022: a worker with it in its environment takes upstream's ggml-vulkan paths where
# 0018-0020 and 0023 make steps of 1..8 rows take one (its exactness cache keys on the
# variables, so it measures its own steps); the fusions are off, whose add+rms crashes
# Mesa's software device (bench/lane_paths.py): the flash attention paths of 0018-0019 remain.
UPSTREAM_PATHS = {"MESHNET_VK_UPSTREAM_PATHS": "1", "GGML_VK_DISABLE_FUSION": "1"}


def test_an_f32_route_that_speculates_and_batches_is_certified_with_every_figure_zero(
        start: Route, shard_worker: Path, smollm2: Path) -> None:
    workers = start("f32")
    # what a recipe of maxDrafts 7 (the widest window) and sessionSlots 2 promises
    promising = LANE.model_copy(update={"verify_rows": 8, "sessions": 2})

    certificate = certify([w.endpoint for w in workers], promising,
                          Reference(shard_worker, smollm2, threads=1),
                          Gates(speed_fraction=SPEED_MEASURED_NOT_GATED.speed_fraction,
                                parity_steps=4, speed_tokens=8, repeats=1), epoch=1)

    assert certificate.passed and certificate.failures == [] and certificate.reasons == []
    parity = certificate.parity
    assert parity.exact and parity.tolerance == 0.0 and parity.max_abs_delta_logit == 0.0
    assert (parity.rows_compared, parity.rows_differing) == (4 * 5, 0)
    assert parity.greedy_match and parity.prompts == 4
    steps = certificate.step_invariance
    assert steps is not None and (steps.window_rows, steps.windows) == (8, 4)
    assert (steps.rows_compared, steps.rows_differing, steps.max_abs_delta_logit) == (32, 0, 0.0)
    batch = certificate.batch_invariance
    assert batch is not None and batch.sessions == 2
    assert (batch.rows_compared, batch.rows_differing, batch.max_abs_delta_logit) == (10, 0, 0.0)
    speed = certificate.speed
    assert speed.decode_tokens_per_second > 0 and speed.reference_decode_tokens_per_second > 0
    assert speed.fraction == pytest.approx(
        speed.decode_tokens_per_second / speed.reference_decode_tokens_per_second, abs=1e-3)
    assert certificate.lane == promising and certificate.stages == 3


def test_a_route_whose_windows_do_not_compute_as_one_row_steps_is_refused(
        start: Route, shard_worker: Path, smollm2: Path) -> None:
    workers = start("f32")
    # The CPU lane's kernels compute SmolLM2 steps of up to 48 rows as one-row steps
    # (measured); at 64 rows they take upstream's wide path and every row differs in its
    # last bits, as a GPU kernel's path for n rows differs from its one-row path.
    beyond = LANE.model_copy(update={"verify_rows": 64})

    certificate = certify([w.endpoint for w in workers], beyond,
                          Reference(shard_worker, smollm2, threads=1),
                          Gates(speed_fraction=0.0, parity_steps=1, speed_tokens=4, repeats=1))

    assert not certificate.passed and certificate.reasons == ["StepInvariance"]
    assert certificate.parity.rows_differing == 0  # the split itself is exact
    steps = certificate.step_invariance
    assert steps is not None and steps.rows_compared == 4 * 64
    assert steps.rows_differing > 0
    assert steps.max_abs_delta_logit is not None and steps.max_abs_delta_logit > 0
    [failure] = certificate.failures
    assert failure.startswith("step invariance: ") and "speculation would change tokens" in failure
    assert certificate.batch_invariance is None  # one session at a time: nothing promised


def test_a_throughput_route_is_certified_without_a_promise_of_sessions_at_once(
        start: Route, shard_worker: Path, smollm2: Path) -> None:
    workers = start("f32")
    throughput = LANE.model_copy(update={"sessions": 4, "batching": "Throughput"})

    certificate = certify([w.endpoint for w in workers], throughput,
                          Reference(shard_worker, smollm2, threads=1),
                          Gates(speed_fraction=0.0, parity_steps=1, speed_tokens=4, repeats=1))

    # its tokens may depend on the load: nothing of sessions at once is checked or claimed
    assert certificate.passed and certificate.batch_invariance is None
    assert certificate.lane.load_dependent and certificate.lane == throughput


@pytest.mark.vulkan
def test_a_vulkan_route_on_upstreams_kernel_paths_is_refused(
        lanes: Callable[[str], Lane], smollm2: Path, tmp_path: Path) -> None:
    """Every layer on the vulkan lane's device, its stages taking upstream's paths by row
    count (flash attention tiles and split_k, the add+rms fusion): a verify window's rows
    are not one-row steps, and a route that promises speculation is not certified for it."""
    on = lanes("vulkan")
    specs = [on.spec(LaunchSpec(model=smollm2, layers=LayerRange(*span),
                                route_id="test/certify", threads=1, slots=2, ctx=512,
                                metrics_listen=""))
             for span in ((0, 15), (15, 30))]
    workers = start_route(on.binary, specs, tmp_path, timeout=600, env=UPSTREAM_PATHS)
    try:
        certificate = certify([w.endpoint for w in workers],
                              LANE.model_copy(update={"backend": "vulkan", "verify_rows": 8}),
                              Reference(on.binary, smollm2, threads=1),
                              Gates(speed_fraction=0.0, parity_steps=1, speed_tokens=2,
                                    repeats=1))
    finally:
        for worker in workers:
            worker.stop()

    assert not certificate.passed and "StepInvariance" in certificate.reasons
    steps = certificate.step_invariance
    assert steps is not None and steps.rows_compared == 4 * 8
    assert steps.rows_differing > 0
    assert steps.max_abs_delta_logit is not None and steps.max_abs_delta_logit > 0
    assert any(failure.startswith("step invariance: ") for failure in certificate.failures)


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
