"""The gates as pure functions, the lane a route runs on, and what the operator decides
about its certification on each pass."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from meshnet.api.certification import ParityResult
from meshnet.api.shardroute import Recipe
from meshnet.certify import lane as lanes
from meshnet.certify import verdict
from meshnet.certify.decide import Observation, decide, judged
from meshnet.certify.gates import Gates
from meshnet.certify.job import JobOutcome
from meshnet.tracker.planner import Shown, plan_pass

from .conftest import LANE, cert

ROW = np.array([0.5, 3.0, -1.0], dtype=np.float32)
NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)


def test_identical_logits_pass_parity_and_a_flipped_argmax_fails_it() -> None:
    same = verdict.parity([verdict.PromptLogits([ROW, ROW], [ROW, ROW], [1, 1])], 1e-3)
    flipped = ROW.copy()
    flipped[0] = 9.0
    differ = verdict.parity([verdict.PromptLogits([ROW, ROW], [ROW, flipped], [1, 1])], 1e-3)

    assert same.max_abs_delta_logit == 0.0 and same.greedy_match and same.decode_steps == 1
    assert differ.max_abs_delta_logit == 8.5 and not differ.greedy_match
    assert differ.first_mismatch == "prompt 0 step 1: route picks 0, the reference 1"


def test_a_non_finite_logit_fails_parity() -> None:
    broken = ROW.copy()
    broken[2] = np.nan
    result = verdict.parity([verdict.PromptLogits([ROW], [broken], [1])], 1e-3)

    assert result.max_abs_delta_logit is None
    assert ("SplitParity", "parity: a logit difference is not finite") in verdict.failures(
        result, verdict.speed(1.0, 1.0, 0.5, "hub"))


def test_the_speed_gate_compares_route_to_reference_decode_speed() -> None:
    pace = verdict.speed(30.0, 40.0, 0.8, "chain")

    assert (pace.fraction, pace.topology) == (0.75, "chain")
    assert verdict.speed(30.0, 40.0, 0.8, "ring").topology == "ring"  # a ring route's figure
    assert verdict.failures(ParityResult(prompts=1, decode_steps=0, max_abs_delta_logit=0.0,
                                         rows_compared=1, rows_differing=0, tolerance=0.0,
                                         exact=True, greedy_match=True), pace) == [
        ("Speed", "speed: 30.0 tok/s is 0.75 of the unsplit 40.0 tok/s; 0.8 is required")]


def test_by_default_parity_is_bit_exact_and_a_tolerance_set_is_recorded_as_not_exact() -> None:
    nudged = ROW.copy()
    nudged[1] += 1e-6  # the same argmax, the last bits of one logit differ
    compared = [verdict.PromptLogits([ROW, ROW], [ROW, nudged], [1, 1])]
    pace = verdict.speed(1.0, 1.0, 0.5, "hub")

    exact = verdict.parity(compared, Gates().tolerance)
    loose = verdict.parity(compared, 1e-3)

    assert Gates().tolerance == 0.0 and exact.exact and exact.greedy_match
    assert (exact.rows_compared, exact.rows_differing) == (2, 1)
    [(code, words)] = verdict.failures(exact, pace)
    assert code == "SplitParity" and "1 of 2 rows are not bit-identical" in words
    assert verdict.failures(loose, pace) == [] and not loose.exact
    passed = verdict.certificate(LANE, loose, pace, stages=2, now="2026-12-07T08:00:00Z")
    assert passed.passed and "(tolerance 0.001: not exact)" in judged(passed).message


def window(*rows: np.ndarray, seam: bytes = b"s") -> list[verdict.Row]:
    return [verdict.Row(row, (seam,)) for row in rows]


def test_windows_and_sessions_at_once_must_match_bit_for_bit_each_with_its_code() -> None:
    other = ROW.copy()
    other[0] = 0.25
    steps = verdict.step_invariance(
        [verdict.WindowRows(window(ROW, ROW), window(ROW, ROW)),
         verdict.WindowRows(window(ROW, ROW, seam=b"t"), window(ROW, ROW))], 2)
    batch = verdict.batch_invariance([verdict.SessionRows(0, [ROW, other], [ROW, ROW])], 2)
    parity = verdict.parity([verdict.PromptLogits([ROW], [ROW], [1])], 0.0)

    certificate = verdict.certificate(LANE.model_copy(update={"verify_rows": 2, "sessions": 2}),
                                      parity, verdict.speed(1.0, 1.0, 0.5, "hub"), stages=2,
                                      now="2026-12-07T08:00:00Z", steps=steps, batch=batch)

    assert (steps.rows_compared, steps.rows_differing, steps.max_abs_delta_logit) == (4, 2, 0.0)
    assert steps.first_difference == "prompt 1 window row 0: boundary after stage 0 differs"
    assert (batch.rows_compared, batch.rows_differing, batch.max_abs_delta_logit) == (2, 1, 0.25)
    assert not certificate.passed
    assert certificate.reasons == ["StepInvariance", "BatchInvariance"]
    assert certificate.failures[0].startswith("step invariance: 2 of 4 rows of 2-row verify")


def test_the_promises_of_the_recipe_are_part_of_the_lane() -> None:
    plain = Recipe(session_slots=1)
    speculating = Recipe.model_validate({"sessionSlots": 4,
                                         "speculation": {"mode": "Lookup", "maxDrafts": 7}})

    assert lanes.promises(plain) == {"verify_rows": 1, "sessions": 1, "batching": "Exact"}
    assert lanes.promises(speculating) == {"verify_rows": 8, "sessions": 4,
                                           "batching": "Exact"}
    # a certificate of plain decoding does not cover a route that starts to speculate
    stored = cert()
    decision = decide(seen(lane=LANE.model_copy(update={"verify_rows": 8}), stored=stored))
    assert decision.create_job and decision.condition.reason == "CertificationRunning"


def test_a_throughput_route_is_certified_as_load_dependent_promising_nothing_of_batches(
) -> None:
    throughput = Recipe.model_validate({"sessionSlots": 4, "batching": "Throughput"})
    lane = LANE.model_copy(update=lanes.promises(throughput))

    assert lane.load_dependent and lane.batching == "Throughput"
    assert "batching Throughput (tokens may depend on the load)" in lane.describe()
    assert "sessions at once" not in lane.describe()
    # its certificate is not one of the Exact route's: a batching edit certifies anew
    assert lane.key() != LANE.model_copy(update={"sessions": 4}).key()
    # one session at a time has no neighbours to depend on
    assert not LANE.model_copy(update={"batching": "Throughput"}).load_dependent


def test_a_failed_promise_reaches_status_and_the_report_as_its_code() -> None:
    steps = verdict.step_invariance([verdict.WindowRows(window(ROW), window(ROW, seam=b"t"))],
                                    8)
    failed = verdict.certificate(
        LANE.model_copy(update={"verify_rows": 8}),
        verdict.parity([verdict.PromptLogits([ROW], [ROW], [1])], 0.0),
        verdict.speed(1.0, 1.0, 0.5, "hub"), stages=2, now="2026-12-07T08:00:00Z", steps=steps)
    body = {"metadata": {"name": "r1", "generation": 1}, "status": {}}

    decision = decide(seen(lane=failed.lane, job_exists=True, outcome=JobOutcome(True, failed)))
    status = plan_pass(body, decision, None, Shown(None, None, None), NOW).status

    assert status is not None
    assert status["certification"]["reasons"] == ["StepInvariance"]
    assert status["certification"]["stepInvariance"]["rowsDiffering"] == 1
    [condition] = status["conditions"]
    assert (condition["reason"], condition["status"]) == ("CertificationFailed", "False")
    assert "failed StepInvariance" in condition["message"]
    reason, message = lanes.verdict(lanes.state(failed.lane, failed))
    assert reason == "CertificationFailed" and "(StepInvariance)" in message


def test_the_gpu_product_comes_from_the_vendors_node_labels() -> None:
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    a100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}

    assert lanes.gpu_product("cpu", [h100]) == "none"
    assert lanes.gpu_product("cuda", [h100, h100]) == "NVIDIA-H100-80GB-HBM3"
    assert lanes.gpu_product("cuda", [h100, a100]) == \
        "NVIDIA-A100-SXM4-80GB+NVIDIA-H100-80GB-HBM3"
    assert lanes.gpu_product("rocm", [{"amd.com/gpu.product-name": "MI300X"}]) == "MI300X"
    assert lanes.gpu_product("cuda", [{}]) == "unknown"


def test_a_certificate_is_valid_only_for_its_exact_lane_when_it_passed() -> None:
    assert cert().valid_for(LANE)
    assert not cert(passed=False).valid_for(LANE)
    assert not cert(recipe_digest="e" * 64).valid_for(LANE)
    assert not cert(manifest_digest="e" * 64).valid_for(LANE)
    assert not cert(gpu_product="MI300X").valid_for(LANE)


def seen(**changes: object) -> Observation:
    fields: dict[str, object] = {"lane": LANE, "route_ready": True, "stored": None,
                                 "request": None, "job_exists": False, "outcome": None,
                                 "image": "meshnet/certify:cpu", "job_name": "r1-certify-x"}
    fields.update(changes)
    return Observation(**fields)  # type: ignore[arg-type]


def test_a_ready_route_without_a_certificate_gets_a_certification_job() -> None:
    decision = decide(seen())

    assert decision.create_job
    assert (decision.condition.status, decision.condition.reason) == (False, "CertificationRunning")


def test_a_route_not_ready_yet_waits_and_a_missing_image_is_said_plainly() -> None:
    assert decide(seen(route_ready=False)).condition.reason == "CertificationPending"
    missing = decide(seen(image=None))
    assert not missing.create_job and missing.condition.reason == "NoCertifier"
    assert "certify.images.cpu" in missing.condition.message


def test_a_running_job_is_waited_for_and_its_certificate_recorded_when_done() -> None:
    assert decide(seen(job_exists=True, outcome=JobOutcome(False))).condition.reason == \
        "CertificationRunning"

    done = decide(seen(job_exists=True, outcome=JobOutcome(True, cert())))

    assert done.certificate == cert() and not done.create_job
    assert (done.condition.status, done.condition.reason) == (True, "LaneCertified")
    assert "split parity max |delta logit| 0 over 36 rows, greedy identical" in \
        done.condition.message


def test_a_failed_certificate_stays_failed_until_a_new_recertify_request() -> None:
    failed = cert(passed=False)

    kept = decide(seen(stored=failed))
    again = decide(seen(stored=failed, request="2026-11-30"))

    assert kept.condition.reason == "CertificationFailed" and not kept.create_job
    assert again.create_job  # the Job for (lane, request) does not exist yet


def test_a_recipe_change_invalidates_the_certificate_and_certifies_the_new_lane() -> None:
    decision = decide(seen(stored=cert(recipe_digest="e" * 64)))

    assert decision.create_job and decision.condition.reason == "CertificationRunning"
    state = lanes.state(LANE, decision.certificate)
    assert not state.passed
    assert lanes.verdict(state)[0] == "LaneNotCertified"


def test_a_job_that_left_no_certificate_is_an_error_and_is_not_rerun() -> None:
    decision = decide(seen(job_exists=True, outcome=JobOutcome(True, error="OOMKilled")))

    assert not decision.create_job and decision.condition.reason == "CertificationError"
    assert "OOMKilled" in decision.condition.message
