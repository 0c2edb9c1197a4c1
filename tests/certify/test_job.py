"""The certification Job runs `meshnet certify` where and as the route's stages run, and
its certificate is read back from the pod's termination message."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from meshnet.api import labels
from meshnet.api.certification import CertifiedLane
from meshnet.api.modelartifact import ArtifactStorage
from meshnet.api.shardroute import Recipe, Stage
from meshnet.certify import job as jobs
from meshnet.certify.decide import CERTIFIED, Decision
from meshnet.certify.gates import Gates
from meshnet.reconcile.conditions import Verdict
from meshnet.reconcile.plan import Create
from meshnet.reconcile.route.identity import LinkTls
from meshnet.reconcile.route.planner import stage_worker
from meshnet.reconcile.route.podspec import RouteRef, StageInputs, WorkerConfig, stage_pod
from meshnet.reconcile.route.workerspec import Identities
from meshnet.tracker.planner import Shown, plan_pass

from .conftest import LANE, cert

ROUTE = RouteRef("r1", "serving", "uid-r1")
CUDA = CertifiedLane(backend="cuda", gpu_product="NVIDIA-H100-80GB-HBM3",
                     manifest_digest="a" * 64, recipe_digest="b" * 64)


def pod(lane: str = "cuda", tls: LinkTls | None = None) -> dict[str, Any]:
    stage = Stage.model_validate({
        "name": "s0", "layers": {"begin": 0, "end": 10}, "resources": {"gpus": 1},
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    second = Stage.model_validate({"name": "s1", "layers": {"begin": 10, "end": 20}})
    recipe = Recipe(lane=lane)
    worker = stage_worker([stage, second], 0, recipe, tls, 3,
                          Identities("a" * 64, "b" * 64, "c" * 64), "model-00001-of-00002.gguf",
                          "serving/r1")
    return stage_pod(StageInputs(
        ROUTE, stage, recipe,
        ArtifactStorage.model_validate({"pvc": {"claimName": "models", "subPath": "dsv4"}}),
        worker), WorkerConfig(images={lane: f"worker:{lane}"}))


def build(lane: CertifiedLane = CUDA, request: str | None = None,
          tls: LinkTls | None = None) -> dict[str, Any]:
    return jobs.certification_job(jobs.JobInputs(
        route=ROUTE, lane=lane, stage_pod=pod(lane.backend, tls),
        endpoints=["10.0.0.5:50051", "10.0.0.6:50051"], image="meshnet/certify:cuda",
        gates=Gates(speed_fraction=0.7), route_digest="c" * 64, epoch=3, request=request))


def test_the_job_runs_certify_against_every_stage_with_the_gates_and_lane() -> None:
    job = build()
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]

    assert container["command"] == ["meshnet"] and args[0] == "certify"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--stage"] == [
        "10.0.0.5:50051", "10.0.0.6:50051"]
    assert args[args.index("--model") + 1] == "/models/model-00001-of-00002.gguf"
    assert args[args.index("--speed-fraction") + 1] == "0.7"
    assert args[args.index("--gpu-product") + 1] == "NVIDIA-H100-80GB-HBM3"
    assert args[args.index("--termination-log") + 1] == "/dev/termination-log"
    assert job["spec"]["backoffLimit"] == 0


def test_the_job_certifies_the_lanes_promises_as_the_operator_judges_them() -> None:
    # the certificate must be of the operator's lane, or it is never valid for it
    throughput = CUDA.model_copy(update={"verify_rows": 4, "sessions": 8,
                                         "batching": "Throughput"})
    args = build(throughput)["spec"]["template"]["spec"]["containers"][0]["args"]

    assert [args[args.index(flag) + 1] for flag in ("--verify-rows", "--sessions", "--batching")
            ] == ["4", "8", "Throughput"]


def test_for_a_tls_route_the_job_trusts_its_ca_and_presents_its_certificate_for_mtls() -> None:
    plain = build()["spec"]["template"]["spec"]
    assert "--tls-ca" not in plain["containers"][0]["args"]
    assert [v["name"] for v in plain["volumes"]] == ["model", "work"]

    for mtls in (False, True):
        spec = build(tls=LinkTls("stage-tls", require_client_cert=mtls))[
            "spec"]["template"]["spec"]
        container = spec["containers"][0]
        args = container["args"]
        assert args[args.index("--tls-ca") + 1] == "/etc/meshnet/tls/ca.crt"
        assert ("--tls-cert" in args) == ("--tls-key" in args) == mtls
        if mtls:
            assert args[args.index("--tls-cert") + 1] == "/etc/meshnet/tls/tls.crt"
            assert args[args.index("--tls-key") + 1] == "/etc/meshnet/tls/tls.key"
        assert {"name": "tls", "mountPath": "/etc/meshnet/tls", "readOnly": True} in \
            container["volumeMounts"]
        assert next(v for v in spec["volumes"] if v["name"] == "tls")["secret"][
            "secretName"] == "stage-tls"


def test_the_job_runs_on_the_stages_hardware_with_their_model_volume() -> None:
    spec = build()["spec"]["template"]["spec"]
    container = spec["containers"][0]

    assert spec["nodeSelector"] == {"pool": "gpu",
                                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    model = next(m for m in container["volumeMounts"] if m["name"] == "model")
    assert (model["mountPath"], model["readOnly"], model["subPath"]) == ("/models", True, "dsv4")
    assert {v["name"] for v in spec["volumes"]} == {"model", "work"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["automountServiceAccountToken"] is False


def test_the_job_is_owned_by_the_route_and_invisible_to_the_stage_pod_index() -> None:
    meta = build()["metadata"]

    assert meta["ownerReferences"][0]["name"] == "r1"
    assert labels.ROUTE not in meta["labels"] and meta["labels"][jobs.CERTIFY_ROUTE] == "r1"
    assert jobs.job_name("r1", CUDA, None) == meta["name"]
    assert jobs.job_name("r1", CUDA, "again") != meta["name"]
    assert jobs.job_name("r1", LANE, None) != meta["name"]


def finished(message: str, succeeded: bool = True) -> tuple[dict[str, Any], list[Any]]:
    job = {"status": {"succeeded": 1} if succeeded else {
        "failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                     "message": "Job has reached the specified backoff limit"}]}}
    pods = [{"status": {"containerStatuses": [{"name": "certify", "state": {
        "terminated": {"exitCode": 0 if succeeded else 1, "message": message}}}]}}]
    return job, pods


def test_the_certificate_is_read_from_the_termination_message_pass_or_fail() -> None:
    passed = jobs.job_outcome(*finished(cert().model_dump_json(by_alias=True)))
    failed = jobs.job_outcome(*finished(cert(passed=False).model_dump_json(by_alias=True),
                                        succeeded=False))

    assert passed.finished and passed.certificate == cert()
    assert failed.finished and failed.certificate is not None
    assert not failed.certificate.passed


def test_a_job_without_a_certificate_reports_its_last_words() -> None:
    outcome = jobs.job_outcome(*finished("Traceback ...\nerror: model not found", False))

    assert outcome.finished and outcome.certificate is None
    assert outcome.error == "error: model not found"
    assert not jobs.job_outcome({"status": {"active": 1}}, []).finished


def test_a_pass_that_starts_certification_plans_the_job_as_a_step_and_certified_as_its_own(
) -> None:
    inputs = jobs.JobInputs(
        route=ROUTE, lane=CUDA, stage_pod=pod(), endpoints=["10.0.0.5:50051"],
        image="meshnet/certify:cuda", gates=Gates(), route_digest=None, epoch=3)
    starting = Decision(Verdict(CERTIFIED, False, "CertificationRunning", "starting"), None,
                        create_job=True)
    route = {"metadata": {"name": "r1", "namespace": "serving", "generation": 4},
             "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    now = datetime(2026, 12, 6, 12, tzinfo=UTC)

    planned = plan_pass(route, starting, inputs, Shown(None, None, None), now)

    (step,) = planned.steps
    assert isinstance(step.action, Create) and step.action.obj == jobs.certification_job(inputs)
    assert step.event is not None and step.event.reason == "CertificationStarted"
    assert planned.own_conditions == (CERTIFIED,)
    assert planned.status is not None and planned.status["conditions"] == [{
        "type": CERTIFIED, "status": "False", "reason": "CertificationRunning",
        "message": "starting", "observedGeneration": 4,
        "lastTransitionTime": "2026-12-06T12:00:00Z"}]
    # Until the stages' endpoints are known there is nothing to start the Job with.
    assert plan_pass(route, starting, None, Shown(None, None, None), now).steps == ()
