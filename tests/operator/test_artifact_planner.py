"""The pure ModelArtifact planner: provisioning Jobs, node labels, conditions and events
from observed state alone. Summaries are real `PullSummary` JSON, passed through the
termination-message compaction, with GGUF facts read from SmolLM2's own headers."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from meshnet.api import labels
from meshnet.api.modelartifact import ArtifactExpectations, ModelArtifactSpec
from meshnet.artifacts.facts import ModelFacts
from meshnet.artifacts.pull import FileOutcome, PullSummary, compact_json
from meshnet.artifacts.verify import read_model_facts
from meshnet.cli.artifact import TERMINATION_LIMIT
from meshnet.reconcile.artifact.jobspec import (
    ArtifactRef,
    ProvisionerConfig,
    job_name,
    provisioning_job,
    spec_hash,
)
from meshnet.reconcile.artifact.observed import (
    Attempt,
    Observed,
    ObservedJob,
    ObservedNode,
    job_phase,
    latest_attempt,
    observe_artifact,
    observe_attempts,
    observe_job,
)
from meshnet.reconcile.artifact.planner import STATUS_KEYS, plan_artifact
from meshnet.reconcile.plan import Plan, merge_patch
from meshnet.reconcile.route.planner import Create, Delete, Patch

CONFIG = ProvisionerConfig(image="meshnet/meshnet-operator:0.1.0")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
MakeArtifact = Callable[..., dict[str, Any]]  # fixture from conftest.py
GPU = {"pool": "gpu"}


@pytest.fixture(scope="module")
def facts(smollm2: Path) -> ModelFacts:
    return read_model_facts(smollm2.parent, [smollm2.name], ArtifactExpectations())


def spec_of(body: dict[str, Any]) -> ModelArtifactSpec:
    return ModelArtifactSpec.model_validate(body["spec"])


def summary(spec: ModelArtifactSpec, result: str = "Verified", message: str = "",
            facts: ModelFacts | None = None, state: str | None = None,
            received: int = 0) -> dict[str, Any]:
    """What `meshnet artifact pull --summary-file /dev/termination-log` leaves there;
    `state` of every file (default downloaded, or failed), `received` bytes of the first."""
    state = state or ("downloaded" if result == "Verified" else "failed")
    report = PullSummary("smollm2", spec.manifest_digest(), "/artifact/smollm2",
                         [FileOutcome(f.name, f.size, state, received if i == 0 else 0)
                          for i, f in enumerate(spec.files)],
                         result=result, message=message, retryable=result != "Verified",
                         facts=facts)
    parsed: dict[str, Any] = json.loads(compact_json(report.to_json(), TERMINATION_LIMIT))
    return parsed


@dataclasses.dataclass
class Cluster:
    """Carries plans out the way the API server would, and lets a test play the Jobs."""

    body: dict[str, Any]
    nodes: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    jobs: dict[str, ObservedJob] = dataclasses.field(default_factory=dict)
    bodies: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    config_maps: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    claims: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)

    def observed(self) -> Observed:
        return Observed(
            observe_artifact(self.body), tuple(self.jobs.values()),
            tuple(self.config_maps),
            tuple(ObservedNode(n, dict(v)) for n, v in sorted(self.nodes.items())),
            self.claims)

    def plan(self, now: datetime = NOW) -> Plan:
        return plan_artifact(self.observed(), CONFIG, now)

    def apply(self, result: Plan) -> None:
        for step in result.steps:
            action = step.action
            if isinstance(action, Create) and action.obj["kind"] == "Job":
                job = observe_job(action.obj)
                assert job is not None
                self.jobs[job.name] = job
                self.bodies[job.name] = action.obj
            elif isinstance(action, Create):
                self.config_maps[action.obj["metadata"]["name"]] = action.obj
            elif isinstance(action, Delete):
                (self.jobs if action.kind == "Job" else self.config_maps).pop(action.name)
            elif isinstance(action, Patch):
                assert action.kind == "Node"
                for key, value in action.body["metadata"]["labels"].items():
                    if value is None:
                        self.nodes[action.name].pop(key, None)
                    else:
                        self.nodes[action.name][key] = value
        if result.status is not None:
            self.body["status"] = result.status

    def step(self, now: datetime = NOW) -> Plan:
        result = self.plan(now)
        self.apply(result)
        return result

    def finish(self, name: str, summary: dict[str, Any] | None, phase: str,
               at: datetime | None = None) -> None:
        """The Job's latest attempt reported `summary` (and ended `at`)."""
        ended = at.strftime("%Y-%m-%dT%H:%M:%SZ") if at else ""
        self.jobs[name] = dataclasses.replace(self.jobs[name], summary=summary, finished_at=ended,
                                              phase=phase)  # type: ignore[arg-type]

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.body["status"]["conditions"] if c["type"] == kind)


def reasons(result: Plan) -> list[str]:
    return [s.event.reason for s in result.steps if s.event] + [e.reason for e in result.events]


def host_path(body: dict[str, Any], selector: dict[str, str] | None = None) -> dict[str, Any]:
    body["spec"]["storage"] = {"hostPath": {"path": "/var/lib/meshnet/models/smollm2",
                                            "nodeSelector": selector or GPU}}
    return body


# --- the Job and its ConfigMap -----------------------------------------------------------


def test_a_pvc_job_pulls_into_the_claim_non_root_with_only_the_storage_writable(
        make_artifact: MakeArtifact) -> None:
    spec = spec_of(make_artifact(ready=False))
    job = provisioning_job(ArtifactRef("smollm2", "ml", "uid-1"), spec, CONFIG)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert job["metadata"]["name"] == f"smollm2-pull-{spec_hash(spec)}"
    assert job["spec"]["backoffLimit"] == 6 and pod["restartPolicy"] == "OnFailure"
    assert job["metadata"]["ownerReferences"] == [{
        "apiVersion": "meshnet.dev/v1alpha1", "kind": "ModelArtifact", "name": "smollm2",
        "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
    assert container["command"] == ["meshnet"]
    assert container["args"] == ["artifact", "pull", "--artifact",
                                 "/etc/meshnet/artifact/artifact.yaml", "--dest",
                                 "/artifact/smollm2", "--summary-file", "/dev/termination-log"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == {"/artifact": False, "/etc/meshnet/artifact": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["storage"]["persistentVolumeClaim"] == {"claimName": "models"}
    assert volumes["spec"]["configMap"]["name"] == f"smollm2-spec-{spec_hash(spec)}"
    assert "affinity" not in pod and pod["automountServiceAccountToken"] is False


def test_a_host_path_job_is_pinned_to_its_node_and_copies_from_a_mounted_source(
        make_artifact: MakeArtifact) -> None:
    body = host_path(make_artifact(ready=False))
    body["spec"]["source"] = {"pvc": {"claimName": "model-source", "subPath": "smollm2"}}
    job = provisioning_job(ArtifactRef("smollm2", "ml", "u"), spec_of(body), CONFIG, "gpu-1")
    pod = job["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]
    assert pod["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["storage"]["hostPath"] == {"path": "/var/lib/meshnet/models/smollm2",
                                              "type": "DirectoryOrCreate"}
    assert volumes["source"]["persistentVolumeClaim"]["readOnly"] is True
    args = pod["containers"][0]["args"]
    assert args[args.index("--dest") + 1] == "/artifact"
    assert args[args.index("--source-dir") + 1] == "/source"
    assert job["metadata"]["annotations"][labels.NODE_ANNOTATION] == "gpu-1"


def test_names_are_deterministic_and_fit_a_label_and_the_node_selector_is_not_hashed(
        make_artifact: MakeArtifact) -> None:
    body = host_path(make_artifact(ready=False))
    spec = spec_of(body)
    assert spec_hash(spec) == spec_hash(spec_of(host_path(make_artifact(ready=False),
                                                          {"pool": "other"})))
    moved = make_artifact(ready=False)
    assert spec_hash(spec_of(moved)) != spec_hash(spec)
    long = "a" * 200
    name = job_name(long, spec_hash(spec), "node-" + "x" * 80)
    assert len(name) <= 63 and name == job_name(long, spec_hash(spec), "node-" + "x" * 80)
    job = provisioning_job(ArtifactRef(long, "ml", "u"), spec, CONFIG, "n1")
    assert all(len(v) <= 63 for v in job["metadata"]["labels"].values())
    assert job["metadata"]["annotations"][labels.ARTIFACT_ANNOTATION] == long


# --- observing Jobs and their pods -------------------------------------------------------


def test_the_job_phase_comes_from_its_conditions_and_active_pods() -> None:
    assert job_phase({}) == "Pending"
    assert job_phase({"active": 1}) == "Running"
    assert job_phase({"conditions": [{"type": "Complete", "status": "True"}]}) == "Succeeded"
    assert job_phase({"active": 1, "conditions": [{"type": "FailureTarget",
                                                   "status": "True"}]}) == "Failed"


def test_the_summary_is_the_latest_finished_attempt_also_of_a_restarted_container(
        make_artifact: MakeArtifact) -> None:
    spec = spec_of(make_artifact(ready=False))
    first = summary(spec, "HashMismatch", "model-00001-of-00002.gguf: sha256 mismatch")
    pod = {"status": {"containerStatuses": [{
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-11-29T12:00:00Z",
                                     "message": json.dumps(first)}}}]}}
    later = {"status": {"containerStatuses": [{"state": {"terminated": {
        "exitCode": 0, "finishedAt": "2026-11-29T12:05:00Z",
        "message": json.dumps(summary(spec))}}}]}}
    crashed = {"status": {"containerStatuses": [{"state": {"terminated": {
        "exitCode": 137, "finishedAt": "2026-11-29T12:09:00Z", "message": ""}}}]}}
    attempts = [a for p in (pod, later, crashed) for a in observe_attempts(p)]
    assert [a.summary["result"] for a in attempts] == ["HashMismatch", "Verified"]
    latest = latest_attempt(attempts)
    assert latest is not None and latest.summary == summary(spec)
    assert latest.finished_at == "2026-11-29T12:05:00Z"
    assert latest_attempt([Attempt("2026-11-29T12:00:00Z", first)]) == Attempt(
        "2026-11-29T12:00:00Z", first)
    assert latest_attempt([]) is None
    assert observe_job({"metadata": {"name": "unrelated"}}) is None


# --- a shared PVC: one Job ---------------------------------------------------------------


def test_a_new_artifact_gets_its_spec_and_a_job_and_is_progressing(
        make_artifact: MakeArtifact) -> None:
    cluster = Cluster(make_artifact(ready=False))
    result = cluster.step()
    kinds = [s.action.obj["kind"] for s in result.steps if isinstance(s.action, Create)]
    assert kinds == ["ConfigMap", "Job"]
    assert reasons(result) == ["ProvisioningStarted"]
    (config_map,) = cluster.config_maps.values()
    assert config_map["immutable"] is True and "artifact.yaml" in config_map["data"]
    status = cluster.body["status"]
    assert status["manifestDigest"] == spec_of(cluster.body).manifest_digest()
    assert status["progress"] == {"filesVerified": 0, "filesTotal": 2, "bytesVerified": 0,
                                  "bytesTotal": 2003}
    assert (cluster.condition("Progressing")["status"],
            cluster.condition("Progressing")["reason"]) == ("True", "Provisioning")
    assert cluster.condition("Ready")["status"] == "False"
    assert cluster.condition("Failed")["status"] == "False"
    again = cluster.plan(NOW + timedelta(minutes=1))
    assert again.steps == () and again.status is None and again.events == ()


def test_a_verified_pull_makes_it_ready_with_the_gguf_facts_once(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = Cluster(make_artifact(ready=False))
    cluster.step()
    (name,) = cluster.jobs
    cluster.finish(name, summary(spec_of(cluster.body), facts=facts), "Succeeded")
    result = cluster.step(NOW + timedelta(minutes=5))
    assert reasons(result) == ["Verified"]
    status = cluster.body["status"]
    assert status["gguf"] == {"architecture": "llama", "blockCount": 30, "layers": 30,
                              "embeddingLength": 576, "boundarySchema": "DENSE_RESIDUAL",
                              "boundaryShape": [576]}
    assert status["progress"]["bytesVerified"] == status["progress"]["bytesTotal"] == 2003
    ready = cluster.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Verified")
    assert ready["lastTransitionTime"] == "2026-11-29T12:05:00Z"
    assert cluster.condition("Failed")["lastTransitionTime"] == "2026-11-29T12:00:00Z"
    again = cluster.plan(NOW + timedelta(minutes=9))
    assert again.steps == () and again.status is None and again.events == ()


def test_a_hash_mismatch_is_retried_then_failed_with_one_event_each(
        make_artifact: MakeArtifact) -> None:
    cluster = Cluster(make_artifact(ready=False))
    cluster.step()
    (name,) = cluster.jobs
    why = "model-00002-of-00002.gguf: sha256 mismatch: expected 1f, got 2e"
    cluster.finish(name, summary(spec_of(cluster.body), "HashMismatch", why), "Running")
    assert reasons(cluster.step()) == ["ProvisioningRetrying"]
    assert cluster.condition("Progressing")["reason"] == "Retrying"
    assert cluster.condition("Ready")["reason"] == "HashMismatch"
    assert cluster.condition("Failed")["status"] == "False"
    assert reasons(cluster.step()) == []
    cluster.finish(name, summary(spec_of(cluster.body), "HashMismatch", why), "Failed")
    assert reasons(cluster.step()) == ["ProvisioningFailed"]
    failed = cluster.condition("Failed")
    assert (failed["status"], failed["reason"], failed["message"]) == ("True", "HashMismatch",
                                                                       why)
    assert cluster.condition("Progressing")["status"] == "False"
    assert cluster.plan().status is None


@pytest.mark.parametrize("reason", ["IncompleteSplitSet", "StorageRefused"])
def test_what_a_retry_cannot_cure_fails_at_once(make_artifact: MakeArtifact,
                                                reason: str) -> None:
    cluster = Cluster(make_artifact(ready=False))
    cluster.step()
    (name,) = cluster.jobs
    cluster.finish(name, summary(spec_of(cluster.body), reason, "no"), "Running")
    assert reasons(cluster.step()) == ["ProvisioningFailed"]
    assert (cluster.condition("Failed")["status"], cluster.condition("Failed")["reason"]) == \
        ("True", reason)


def test_a_spec_change_replaces_the_job_and_ignores_the_old_summary(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = Cluster(make_artifact(ready=False))
    cluster.step()
    (old,) = cluster.jobs
    cluster.finish(old, summary(spec_of(cluster.body), facts=facts), "Succeeded")
    cluster.step()
    stale = summary(spec_of(cluster.body), facts=facts)
    cluster.body["spec"]["files"][0]["size"] += 1
    cluster.body["metadata"]["generation"] = 2
    result = cluster.step()
    assert reasons(result) == ["ProvisioningStarted", "ProvisioningSuperseded"]
    (new,) = cluster.jobs
    assert new != old and len(cluster.config_maps) == 1
    assert cluster.condition("Ready")["status"] == "False"
    assert cluster.condition("Ready")["observedGeneration"] == 2
    assert "gguf" not in cluster.body["status"]
    cluster.finish(new, stale, "Succeeded")  # a summary of the old manifest
    cluster.step()
    assert cluster.condition("Ready")["reason"] == "Provisioning"


def test_an_unparsable_spec_is_invalid_once_and_gets_no_job(
        make_artifact: MakeArtifact) -> None:
    cluster = Cluster(make_artifact(ready=False))
    cluster.step()
    cluster.body["spec"]["files"] = []
    result = cluster.step()
    assert reasons(result) == ["ProvisioningSuperseded", "InvalidSpec"]
    assert not cluster.jobs and not cluster.config_maps
    failed = cluster.condition("Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
    assert "spec.files" in failed["message"]
    assert "manifestDigest" not in cluster.body["status"]
    assert reasons(cluster.step()) == []


def test_storage_under_home_is_refused_without_a_job(make_artifact: MakeArtifact) -> None:
    body = make_artifact(ready=False, host_path=True)
    body["spec"]["storage"]["hostPath"]["path"] = "/home/me/models"
    cluster = Cluster(body, nodes={"n1": {}})
    result = cluster.step()
    assert not cluster.jobs and reasons(result) == ["ProvisioningFailed"]
    assert cluster.condition("Failed")["reason"] == "StorageRefused"
    assert "/home" in cluster.condition("Failed")["message"]


# --- host paths: a copy per selected node ------------------------------------------------


def gpu_cluster(make_artifact: MakeArtifact) -> Cluster:
    return Cluster(host_path(make_artifact(ready=False)),
                   nodes={"gpu-a": dict(GPU), "gpu-b": dict(GPU), "cpu-a": {"pool": "cpu"}})


def test_every_selected_node_gets_a_job_and_verified_copies_label_their_node(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = gpu_cluster(make_artifact)
    result = cluster.step()
    assert reasons(result) == ["ProvisioningStarted"] * 2
    jobs = {str(j.node): name for name, j in cluster.jobs.items()}
    assert sorted(jobs) == ["gpu-a", "gpu-b"]
    assert cluster.condition("Progressing")["status"] == "True"
    key = labels.artifact_node_label(spec_of(cluster.body).manifest_digest())

    cluster.finish(jobs["gpu-b"], summary(spec_of(cluster.body), facts=facts), "Succeeded")
    result = cluster.step()
    assert reasons(result) == ["NodeLabeled", "Verified"]
    assert cluster.nodes["gpu-b"][key] == "verified"
    assert key not in cluster.nodes["gpu-a"] and key not in cluster.nodes["cpu-a"]
    status = cluster.body["status"]
    assert status["nodes"] == [
        {"node": "gpu-a", "verified": False,
         "message": "Provisioning: the provisioning Job is pending"},
        {"node": "gpu-b", "verified": True, "message": ""}]
    assert cluster.condition("Ready")["message"] == "verified on 1/2 nodes (gpu-b)"
    assert cluster.condition("Progressing")["status"] == "True"
    assert status["gguf"]["blockCount"] == 30

    cluster.finish(jobs["gpu-a"], summary(spec_of(cluster.body), "StorageRefused",
                                          "not enough space"), "Running")
    cluster.step()
    failed = cluster.condition("Failed")
    assert (failed["status"], failed["reason"]) == ("True", "StorageRefused")
    assert failed["message"] == "gpu-a: not enough space"
    assert cluster.condition("Ready")["status"] == "True"


def test_a_node_that_leaves_the_selector_loses_its_job_and_its_label(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = gpu_cluster(make_artifact)
    cluster.step()
    for name in list(cluster.jobs):
        cluster.finish(name, summary(spec_of(cluster.body), facts=facts), "Succeeded")
    cluster.step()
    key = labels.artifact_node_label(spec_of(cluster.body).manifest_digest())
    assert cluster.nodes["gpu-a"][key] == cluster.nodes["gpu-b"][key] == "verified"
    cluster.nodes["gpu-a"]["pool"] = "cpu"
    result = cluster.step()
    assert sorted(reasons(result)) == ["NodeUnlabeled", "ProvisioningSuperseded"]
    assert key not in cluster.nodes["gpu-a"]
    assert [j.node for j in cluster.jobs.values()] == ["gpu-b"]
    assert [n["node"] for n in cluster.body["status"]["nodes"]] == ["gpu-b"]


def test_labels_of_the_same_bytes_held_for_another_artifact_are_left_alone(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = gpu_cluster(make_artifact)
    digest = spec_of(cluster.body).manifest_digest()
    key = labels.artifact_node_label(digest)
    cluster.nodes["cpu-a"][key] = cluster.nodes["gpu-a"][key] = "verified"
    cluster.claims = {digest: frozenset({"cpu-a"})}
    result = cluster.step()
    unlabeled = [s.action.name for s in result.steps
                 if isinstance(s.action, Patch)]
    assert unlabeled == ["gpu-a"]
    assert cluster.nodes["cpu-a"][key] == "verified" and key not in cluster.nodes["gpu-a"]


def test_an_earlier_manifests_labels_stay_until_a_later_copy_is_verified(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    """A pull replaces no file before every file verified, so until then each node holds
    the earlier manifest's copy whole: a wrong sha256 in the spec must not make the
    running epoch's pods unschedulable (it used to unlabel every node at once)."""
    cluster = gpu_cluster(make_artifact)
    cluster.step()
    for name in list(cluster.jobs):
        cluster.finish(name, summary(spec_of(cluster.body), facts=facts), "Succeeded")
    cluster.step()
    old = labels.artifact_node_label(spec_of(cluster.body).manifest_digest())
    cluster.body["spec"]["files"][1]["sha256"] = "e" * 64
    spec = spec_of(cluster.body)
    new = labels.artifact_node_label(spec.manifest_digest())

    result = cluster.step()
    assert reasons(result).count("ProvisioningStarted") == 2
    assert "NodeUnlabeled" not in reasons(result)
    assert cluster.nodes["gpu-a"][old] == cluster.nodes["gpu-b"][old] == "verified"
    assert cluster.condition("Ready")["status"] == "False"

    jobs = {str(j.node): name for name, j in cluster.jobs.items()}
    mismatch = f"{spec.files[1].name}: sha256 is {'f' * 64}, the manifest says {'e' * 64}"
    cluster.finish(jobs["gpu-a"], summary(spec, "HashMismatch", mismatch), "Failed")
    cluster.finish(jobs["gpu-b"], summary(spec, facts=facts), "Succeeded")
    result = cluster.step()
    assert cluster.nodes["gpu-a"][old] == "verified" and new not in cluster.nodes["gpu-a"]
    assert cluster.nodes["gpu-b"] == {**GPU, new: "verified"}  # its files were replaced
    failed = cluster.condition("Failed")
    assert (failed["status"], failed["reason"]) == ("True", "HashMismatch")
    assert "e" * 64 in failed["message"] and spec.files[1].name in failed["message"]

    original = {str(j.node): name for name, j in cluster.jobs.items()
                if j.spec_hash != spec_hash(spec)}
    assert list(original) == ["gpu-a"]  # the Job that verified gpu-a's copy stays
    cluster.body["spec"]["files"][1]["sha256"] = make_artifact()["spec"]["files"][1]["sha256"]
    result = cluster.step()  # the undo: gpu-a's copy is that manifest's, verified already
    assert "ProvisioningStarted" in reasons(result)  # for gpu-b, whose files were replaced
    assert original["gpu-a"] in cluster.jobs and cluster.nodes["gpu-a"][old] == "verified"
    assert [str(j.node) for j in cluster.jobs.values() if j.phase != "Succeeded"] == ["gpu-b"]

    cluster.nodes["gpu-a"]["pool"] = "cpu"  # no longer selected: nothing vouches for it
    cluster.step()
    assert old not in cluster.nodes["gpu-a"]


def test_no_matching_node_is_storage_refused(make_artifact: MakeArtifact) -> None:
    cluster = Cluster(host_path(make_artifact(ready=False), {"pool": "tpu"}),
                      nodes={"cpu-a": {"pool": "cpu"}})
    assert reasons(cluster.step()) == ["ProvisioningFailed"]
    assert not cluster.jobs and not cluster.config_maps
    failed = cluster.condition("Failed")
    assert (failed["reason"], failed["message"]) == (
        "StorageRefused", "no node matches storage.hostPath.nodeSelector {'pool': 'tpu'}")


def test_a_deleted_artifact_takes_its_labels_and_children_away(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = gpu_cluster(make_artifact)
    cluster.step()
    for name in list(cluster.jobs):
        cluster.finish(name, summary(spec_of(cluster.body), facts=facts), "Succeeded")
    cluster.step()
    cluster.body["metadata"]["deletionTimestamp"] = "2026-11-29T13:00:00Z"
    result = cluster.step()
    assert result.status is None
    assert not cluster.jobs and not cluster.config_maps
    assert all(not any(k.startswith(labels.ARTIFACT_NODE_PREFIX) for k in n)
               for n in cluster.nodes.values())
    deleted = [s.action.name for s in result.steps if isinstance(s.action, Delete)]
    assert len(deleted) == 3  # two Jobs, one ConfigMap


def test_a_status_merge_patch_removes_what_the_new_status_lacks() -> None:
    old = {"gguf": {"architecture": "llama", "embeddingLength": 576}, "nodes": [1],
           "size": "1KiB", "conditions": []}
    new = {"gguf": {"architecture": "llama"}, "nodes": [], "size": "1KiB", "conditions": []}
    assert merge_patch(old, new, STATUS_KEYS) == {"gguf": {"embeddingLength": None}, "nodes": []}
    assert merge_patch(new, new, STATUS_KEYS) == {}


# --- full re-hashes of verified copies ---------------------------------------------------

WEEK = timedelta(days=7)


def created_jobs(result: Plan) -> list[dict[str, Any]]:
    return [s.action.obj for s in result.steps
            if isinstance(s.action, Create) and s.action.obj["kind"] == "Job"]


def test_a_verified_copy_is_re_hashed_in_full_each_interval_and_stays_ready_meanwhile(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = Cluster(make_artifact(ready=False))
    cluster.step()
    (pull,) = cluster.jobs
    spec = spec_of(cluster.body)
    cluster.finish(pull, summary(spec, facts=facts), "Succeeded", at=NOW)
    cluster.step(NOW + timedelta(minutes=1))
    assert cluster.body["status"]["verification"] == {
        "checkedAt": "2026-11-29T12:00:00Z", "hashedBytes": 2003, "markerBytes": 0,
        "nextFullHashAt": "2026-12-06T12:00:00Z"}
    assert cluster.plan(NOW + WEEK - timedelta(seconds=1)).steps == ()

    due = cluster.step(NOW + WEEK)
    (job,) = created_jobs(due)
    assert reasons(due) == ["RehashStarted"]
    assert job["metadata"]["name"] == "smollm2-rehash-" + spec_hash(spec) + "-20261129t120000z"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--full"
    assert due.status is None  # still Ready on the last check while the re-hash runs
    assert cluster.condition("Ready")["status"] == "True"
    assert created_jobs(cluster.step(NOW + WEEK * 2)) == []  # one at a time

    rehash = job["metadata"]["name"]
    later = NOW + WEEK + timedelta(minutes=3)
    cluster.finish(rehash, summary(spec, facts=facts, state="verified"), "Succeeded", at=later)
    done = cluster.step(later + timedelta(seconds=5))
    assert reasons(done) == ["Rehashed"]
    assert cluster.body["status"]["verification"]["checkedAt"] == "2026-12-06T12:03:00Z"
    assert cluster.condition("Ready")["status"] == "True"
    assert cluster.plan(later + timedelta(minutes=1)).events == ()  # announced once

    # The next round replaces the previous re-hash Job; the provisioning Job stays.
    cluster.step(later + WEEK)
    (second,) = set(cluster.jobs) - {pull, rehash}
    cluster.finish(second, summary(spec, facts=facts, state="verified"), "Succeeded",
                   at=later + WEEK + timedelta(minutes=3))
    cleanup = cluster.step(later + WEEK + timedelta(minutes=4))
    assert [s.action.name for s in cleanup.steps if isinstance(s.action, Delete)] == [rehash]
    assert "ProvisioningSuperseded" not in reasons(cleanup)
    assert set(cluster.jobs) == {pull, second}


def test_a_re_hash_that_refetched_damaged_bytes_is_a_warning_and_the_status_says_so(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = Cluster(make_artifact(ready=False))
    cluster.step()
    (pull,) = cluster.jobs
    spec = spec_of(cluster.body)
    # A later pull that trusted its markers: nothing hashed, everything by marker.
    cluster.finish(pull, summary(spec, facts=facts, state="skipped"), "Succeeded", at=NOW)
    cluster.step(NOW)
    check = cluster.body["status"]["verification"]
    assert (check["hashedBytes"], check["markerBytes"]) == (0, 2003)
    (job,) = created_jobs(cluster.step(NOW + WEEK))
    cluster.finish(job["metadata"]["name"], summary(spec, facts=facts, received=1003),
                   "Succeeded", at=NOW + WEEK + timedelta(minutes=1))
    result = cluster.step(NOW + WEEK + timedelta(minutes=2))
    (event,) = result.events
    assert (event.type, event.reason) == ("Warning", "CopyRepaired")
    assert "fetched 1003B again" in event.message
    check = cluster.body["status"]["verification"]
    assert (check["hashedBytes"], check["markerBytes"]) == (2003, 0)


def test_a_re_hash_that_fails_unverifies_the_copy_and_is_retried_an_hour_later(
        make_artifact: MakeArtifact, facts: ModelFacts) -> None:
    cluster = gpu_cluster(make_artifact)
    cluster.step()
    spec = spec_of(cluster.body)
    key = labels.artifact_node_label(spec.manifest_digest())
    for name in list(cluster.jobs):
        cluster.finish(name, summary(spec, facts=facts), "Succeeded", at=NOW)
    cluster.step(NOW)
    assert cluster.nodes["gpu-a"][key] == cluster.nodes["gpu-b"][key] == "verified"
    assert [n["verification"]["nextFullHashAt"] for n in cluster.body["status"]["nodes"]] \
        == ["2026-12-06T12:00:00Z"] * 2
    jobs = created_jobs(cluster.step(NOW + WEEK))
    assert sorted(j["metadata"]["annotations"][labels.NODE_ANNOTATION] for j in jobs) == \
        ["gpu-a", "gpu-b"]
    failing = next(j["metadata"]["name"] for j in jobs if j["metadata"]["name"].find("gpu-a") > 0)
    why = "model-00001-of-00002.gguf: sha256 mismatch: expected 1f, got 2e"
    failed_at = NOW + WEEK + timedelta(minutes=1)
    cluster.finish(failing, summary(spec, "HashMismatch", why), "Failed", at=failed_at)
    result = cluster.step(failed_at)
    assert key not in cluster.nodes["gpu-a"] and cluster.nodes["gpu-b"][key] == "verified"
    assert "NodeUnlabeled" in reasons(result) and "ProvisioningFailed" in reasons(result)
    assert cluster.condition("Ready")["status"] == "True"  # gpu-b still holds one
    assert created_jobs(cluster.plan(failed_at + timedelta(minutes=59))) == []
    (retry,) = created_jobs(cluster.plan(failed_at + timedelta(hours=1)))
    assert retry["metadata"]["annotations"][labels.NODE_ANNOTATION] == "gpu-a"


def test_no_re_hash_when_the_interval_is_off(make_artifact: MakeArtifact,
                                             facts: ModelFacts) -> None:
    cluster = Cluster(make_artifact(ready=False))
    cluster.step()
    (pull,) = cluster.jobs
    cluster.finish(pull, summary(spec_of(cluster.body), facts=facts), "Succeeded", at=NOW)
    never = dataclasses.replace(CONFIG, rehash_every=None)
    result = plan_artifact(cluster.observed(), never, NOW + WEEK * 52)
    assert created_jobs(result) == []
    assert result.status is not None and "nextFullHashAt" not in result.status["verification"]
