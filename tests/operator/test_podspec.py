"""Stage pods: worker arguments, placement, GPUs and a locked-down security context."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from meshnet.api.modelartifact import ArtifactStorage
from meshnet.api.shardroute import LayerRange, Recipe, Stage
from meshnet.reconcile.route.identity import LinkTls
from meshnet.reconcile.route.planner import stage_worker
from meshnet.reconcile.route.podspec import (
    RouteRef,
    StageInputs,
    WorkerConfig,
    stage_pod,
    worker_args,
)
from meshnet.reconcile.route.topology import UNLINKED, StageLinks
from meshnet.reconcile.route.workerspec import Identities, WorkerSpec

CONFIG = WorkerConfig(images={"cuda": "worker-cuda:1", "cpu": "worker-cpu:1"}, pin_digest="p")
DIGEST = "d" * 64
ROUTE = RouteRef("r1", "ml", "uid-1")


def pod(stage: dict[str, Any], recipe: dict[str, Any] | None = None,
        storage: dict[str, Any] | None = None, tls: LinkTls | None = None,
        links: StageLinks = UNLINKED) -> dict[str, Any]:
    """The pod of `stage`, the first of three, as the planner builds it."""
    stages = [Stage.model_validate(stage), *(Stage.model_validate(
        {"name": f"s{i}", "layers": {"begin": 20 + i, "end": 21 + i}}) for i in (2, 3))]
    parsed = Recipe.model_validate(recipe or {})
    worker = stage_worker(stages, 0, parsed, tls, 3, Identities(DIGEST, "e" * 64, "f" * 64),
                          "m-00001-of-00002.gguf", "ml/r1")
    inputs = StageInputs(
        ROUTE, stages[0], parsed,
        ArtifactStorage.model_validate(storage or {"pvc": {"claimName": "models"}}),
        replace(worker, links=links))
    return stage_pod(inputs, CONFIG)


STAGE = {"name": "s1", "layers": {"begin": 10, "end": 20}}


def test_worker_args_carry_the_model_range_route_epoch_ports_and_recipe() -> None:
    worker = WorkerSpec(stage="s1", layers=LayerRange(10, 20), route_id="ml/r1", epoch=3,
                        identities=Identities("m" * 64, "r" * 64, "d" * 64), model_file="m.gguf",
                        slots=2, context_length=8192, boundary_dtype="bf16", pipeline_depth=3)
    args = worker_args(worker, ROUTE, CONFIG)
    assert args == ["--model", "/models/m.gguf", "--layers", "10:20", "--route-id", "ml/r1",
                    "--epoch", "3", "--manifest-digest", "m" * 64, "--recipe-digest", "r" * 64,
                    "--route-digest", "d" * 64, "--listen", "0.0.0.0:50051",
                    "--metrics-listen", "0.0.0.0:9090", "--slots", "2", "--ctx", "8192",
                    "--boundary-dtype", "bf16", "--pipeline-depth", "3",
                    "--route-key-file", "/etc/meshnet/route-key/route.key"]


def test_stage_pods_tell_their_worker_the_artifact_recipe_and_route_they_serve() -> None:
    args = pod(STAGE)["spec"]["containers"][0]["args"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert (flags["--manifest-digest"], flags["--recipe-digest"], flags["--route-digest"]) == (
        DIGEST, "e" * 64, "f" * 64)


def test_stages_with_gpus_offload_every_layer_they_own() -> None:
    gpu_stage = {**STAGE, "resources": {"gpus": 1}}
    assert args_of(pod(gpu_stage, {"lane": "cuda"}))[-2:] == ["--gpu-layers", "9999"]
    named = {**STAGE, "resources": {"gpus": 1, "gpuResourceName": "example.com/gpu"}}
    for stage, lane in ((STAGE, "cuda"), (named, "cpu")):  # no GPU, or a CPU lane
        assert "--gpu-layers" not in pod(stage, {"lane": lane})["spec"]["containers"][0]["args"]


def test_tls_adds_certificate_flags_and_a_read_only_secret_mount() -> None:
    body = pod(STAGE, tls=LinkTls("stage-tls", require_client_cert=True))
    container = body["spec"]["containers"][0]
    assert args_of(body)[-6:] == ["--tls-cert", "/etc/meshnet/tls/tls.crt",
                                      "--tls-key", "/etc/meshnet/tls/tls.key",
                                      "--tls-client-ca", "/etc/meshnet/tls/ca.crt"]
    assert {"name": "tls", "mountPath": "/etc/meshnet/tls", "readOnly": True} in \
        container["volumeMounts"]


NEXT = "s2-e3.r1-workers.ml.svc:50051"  # the addresses of stages s2 and s3
LAST = "s3-e3.r1-workers.ml.svc:50051"
CA = ["--next-stage-ca", "/etc/meshnet/tls/ca.crt"]


def args_of(body: dict[str, Any]) -> list[str]:
    """The worker's args but the route key's, which every stage pod ends with (below)."""
    args = list(body["spec"]["containers"][0]["args"])
    assert args[-2:] == ["--route-key-file", "/etc/meshnet/route-key/route.key"]
    return args[:-2]


def test_every_stage_reads_the_route_key_where_the_routes_secret_is_mounted() -> None:
    """Its stages serve the RPCs that run, read or end a session only to holders."""
    for body in (pod(STAGE), pod(STAGE, links=StageLinks(next_stage="s2", ring_last="s3")),
                 pod(STAGE, tls=LinkTls("stage-tls", require_client_cert=True))):
        args = list(body["spec"]["containers"][0]["args"])
        assert args.count("--route-key-file") == 1
        assert args[args.index("--route-key-file") + 1] == "/etc/meshnet/route-key/route.key"


def test_a_chained_stage_relays_to_its_next_stage_and_a_ring_head_also_subscribes_at_the_last(
) -> None:
    chained = args_of(pod(STAGE, links=StageLinks(next_stage="s2")))
    ringed = args_of(pod(STAGE, links=StageLinks(next_stage="s2", ring_last="s3")))
    hub = args_of(pod(STAGE))
    assert chained == [*hub, "--next-stage", NEXT]
    assert ringed == [*hub, "--next-stage", NEXT, "--ring-last", LAST]


def flags_of(worker: WorkerSpec) -> dict[str, str]:
    args = worker_args(worker, ROUTE, CONFIG)
    return {k: v for k, v in zip(args[::2], args[1::2], strict=True)
            if k in ("--max-loop-drafts", "--max-loop-windows", "--discard-depth")}


def route_workers(speculation: dict[str, Any]) -> list[WorkerSpec]:
    stages = [Stage.model_validate({"name": f"s{i}", "layers": {"begin": b, "end": e}})
              for i, (b, e) in enumerate(((0, 10), (10, 20), (20, 30)))]
    recipe = Recipe.model_validate({"topology": "ring", "speculation": speculation})
    return [stage_worker(stages, i, recipe, None, 3, Identities(DIGEST, "e" * 64, "f" * 64),
                         "m.gguf", "ml/r1") for i in range(3)]


def test_a_speculating_route_bounds_its_first_stages_loops_and_sizes_every_stages_rollback(
) -> None:
    head, middle, tail = map(flags_of, route_workers({"mode": "Lookup", "maxDrafts": 5,
                                                       "maxWindows": 3}))
    assert head == {"--max-loop-drafts": "5", "--max-loop-windows": "3",
                    "--discard-depth": str(3 * (5 + 1) - 1)}
    assert middle == tail == {"--discard-depth": "17"}


def test_a_route_that_does_not_speculate_lets_no_loop_draft_and_keeps_no_rollback() -> None:
    head, middle, tail = map(flags_of, route_workers({"maxDrafts": 5, "maxWindows": 3}))
    assert head == {"--max-loop-drafts": "0", "--max-loop-windows": "1"}
    assert middle == tail == {}


@pytest.mark.parametrize("mtls", [False, True])
def test_with_tls_a_chained_stage_trusts_its_next_stage_with_the_route_ca(mtls: bool) -> None:
    tls = LinkTls("stage-tls", require_client_cert=mtls)
    hub = args_of(pod(STAGE, tls=tls))
    ringed = args_of(pod(STAGE, tls=tls, links=StageLinks(next_stage="s2", ring_last="s3")))
    assert ringed == [*hub, "--next-stage", NEXT, *CA, "--ring-last", LAST]
    # the worker refuses --next-stage-ca without --next-stage: a hub stage has neither
    assert "--next-stage-ca" not in hub and "--next-stage" not in hub


def test_stage_pods_run_non_root_read_only_without_privilege_escalation() -> None:
    spec = pod(STAGE)["spec"]
    container = spec["containers"][0]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    model = next(m for m in container["volumeMounts"] if m["name"] == "model")
    assert model["readOnly"] is True
    assert spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": "models",
                                                           "readOnly": True}


def test_probes_use_the_grpc_health_service_and_ports_are_declared() -> None:
    container = pod(STAGE)["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 50051}
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [
        ("grpc", 50051), ("metrics", 9090)]


def test_gpus_node_selector_tolerations_and_affinity_come_from_the_stage() -> None:
    affinity = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    stage = {**STAGE, "resources": {"gpus": 2, "requests": {"memory": "8Gi"}},
             "nodeSelector": {"pool": "h100"}, "affinity": affinity,
             "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    spec = pod(stage, recipe={"lane": "cuda"})["spec"]
    resources = spec["containers"][0]["resources"]
    assert resources == {"requests": {"memory": "8Gi", "nvidia.com/gpu": "2"},
                         "limits": {"nvidia.com/gpu": "2"}}
    assert spec["containers"][0]["image"] == "worker-cuda:1"
    assert spec["nodeSelector"] == {"pool": "h100"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["affinity"] == affinity


def test_host_path_artifacts_pin_pods_to_nodes_with_a_verified_copy() -> None:
    spec = pod(STAGE, storage={"hostPath": {"path": "/var/lib/meshnet/models"}})["spec"]
    assert spec["nodeSelector"] == {f"artifact.meshnet.dev/{DIGEST[:32]}": "verified"}
    assert spec["volumes"][0]["hostPath"] == {"path": "/var/lib/meshnet/models",
                                              "type": "Directory"}


def test_pods_carry_route_stage_epoch_and_digest_labels_and_an_owner() -> None:
    meta = pod(STAGE)["metadata"]
    assert meta["name"] == "r1-s1-e3"
    assert {k: meta["labels"][k] for k in ("meshnet.dev/route", "meshnet.dev/stage",
                                           "meshnet.dev/epoch", "meshnet.dev/route-digest")} \
        == {"meshnet.dev/route": "r1", "meshnet.dev/stage": "s1", "meshnet.dev/epoch": "3",
            "meshnet.dev/route-digest": "f" * 16}
    assert meta["ownerReferences"] == [{"apiVersion": "meshnet.dev/v1alpha1",
                                        "kind": "ShardRoute", "name": "r1", "uid": "uid-1",
                                        "controller": True, "blockOwnerDeletion": True}]


def test_long_names_are_trimmed_to_a_dns_label_with_a_stable_hash() -> None:
    from meshnet.reconcile.naming import pod_name
    name = pod_name("a" * 60, "stage", 12)
    assert len(name) == 63 and name == pod_name("a" * 60, "stage", 12)
    assert name != pod_name("a" * 60, "stage", 13)
