"""Pure builders of a ModelArtifact's provisioning children: the ConfigMap holding the
artifact spec and the Job running `meshnet artifact pull` on the target storage (one Job
per selected node for host-path storage). Nothing here talks to the cluster."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import yaml

from meshnet.api import labels
from meshnet.api.common import API_VERSION
from meshnet.api.modelartifact import KIND, ModelArtifactSpec
from meshnet.reconcile.children import CONTAINER_SECURITY, POD_SECURITY, template_hash
from meshnet.reconcile.naming import DNS_LABEL, child_name

SPEC_DIR = "/etc/meshnet/artifact"  # the ConfigMap, read-only
SPEC_FILE = "artifact.yaml"
STORAGE_DIR = "/artifact"  # the target PVC or host path, the only writable mount
SOURCE_DIR = "/source"  # a source PVC or host path, read-only
TERMINATION_LOG = "/dev/termination-log"  # the kubelet keeps it: the operator reads status there
CONTAINER = "pull"
HOSTNAME_FIELD = "metadata.name"


@dataclass(frozen=True)
class ProvisionerConfig:
    """Operator-wide inputs of every provisioning Job (from settings)."""

    image: str
    backoff_limit: int = 6  # retries, with the Job controller's exponential back-off
    requests: tuple[tuple[str, str], ...] = (("cpu", "100m"), ("memory", "128Mi"))
    limits: tuple[tuple[str, str], ...] = (("memory", "512Mi"),)
    # How long a verified copy goes on markers (size and mtime) before a Job re-hashes
    # every byte of it; None: never.
    rehash_every: timedelta | None = timedelta(days=7)


@dataclass(frozen=True)
class ArtifactRef:
    """The owning ModelArtifact: enough to name, label and own its children."""

    name: str
    namespace: str
    uid: str


def spec_hash(spec: ModelArtifactSpec) -> str:
    """What a provisioning Job does, as 10 hex digits: any change means a new Job (a Job's
    pod template cannot change). The node selector is left out: it only chooses nodes."""
    body = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    if spec.storage.host_path is not None:
        body["storage"]["hostPath"].pop("nodeSelector", None)
    return template_hash(body)[:10]


def label_value(name: str) -> str:
    """A name as a label value (at most 63 characters; longer ones keep a hash suffix)."""
    return child_name(name, limit=DNS_LABEL)


def config_map_name(artifact: str, digest: str) -> str:
    return child_name(artifact, "spec", digest)


def job_name(artifact: str, digest: str, node: str | None = None) -> str:
    return child_name(artifact, "pull", digest, *([node] if node else []))


def rehash_job_name(artifact: str, digest: str, node: str | None, round_: str) -> str:
    """`round_` is the time of the check it follows: one re-hash per check, never two."""
    return child_name(artifact, "rehash", digest, *([node] if node else []), round_)


def rehash_round(finished_at: str) -> str:
    """An RFC 3339 time as a name part: 2026-11-29T12:00:00Z -> 20261129t120000z."""
    return "".join(c for c in finished_at.lower() if c.isalnum())


def owner_reference(ref: ArtifactRef) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": ref.name, "uid": ref.uid,
            "controller": True, "blockOwnerDeletion": True}


def _labels(ref: ArtifactRef, digest: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "meshnet-artifact-pull",
            "app.kubernetes.io/instance": label_value(ref.name),
            labels.MANAGED_BY: labels.OPERATOR_NAME, labels.ARTIFACT: label_value(ref.name),
            labels.TEMPLATE: digest}


def spec_document(name: str, spec: ModelArtifactSpec) -> str:
    """The ModelArtifact YAML that `meshnet artifact pull --artifact` reads."""
    return yaml.safe_dump({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
                           "spec": spec.model_dump(by_alias=True, exclude_none=True,
                                                   mode="json")}, sort_keys=False)


def spec_config_map(ref: ArtifactRef, spec: ModelArtifactSpec) -> dict[str, Any]:
    """The artifact spec handed to the Job; immutable, so a new spec gets a new ConfigMap."""
    digest = spec_hash(spec)
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_map_name(ref.name, digest), "namespace": ref.namespace,
                     "labels": _labels(ref, digest),
                     "annotations": {labels.ARTIFACT_ANNOTATION: ref.name},
                     "ownerReferences": [owner_reference(ref)]},
        "immutable": True,
        "data": {SPEC_FILE: spec_document(ref.name, spec)},
    }


def _storage(spec: ModelArtifactSpec) -> tuple[dict[str, Any], str]:
    """The storage volume and the destination folder inside its mount."""
    storage = spec.storage
    if storage.pvc is not None:
        # The whole claim is mounted: `pull` creates the subPath itself, as the pod's user
        # (a subPath the kubelet creates would belong to root).
        dest = f"{STORAGE_DIR}/{storage.pvc.sub_path}".rstrip("/")
        claim = {"claimName": storage.pvc.claim_name}
        return {"name": "storage", "persistentVolumeClaim": claim}, dest
    assert storage.host_path is not None  # the CRD requires exactly one
    return {"name": "storage", "hostPath": {"path": storage.host_path.path,
                                            "type": "DirectoryOrCreate"}}, STORAGE_DIR


def _source(spec: ModelArtifactSpec) -> dict[str, Any] | None:
    source = spec.source
    if source.pvc is not None:  # `pull --source-dir` applies the subPath inside the mount
        return {"name": "source", "persistentVolumeClaim": {"claimName": source.pvc.claim_name,
                                                            "readOnly": True}}
    if source.host_path is not None:
        return {"name": "source", "hostPath": {"path": source.host_path.path,
                                               "type": "Directory"}}
    return None


def pull_args(dest: str, source_dir: str | None, full: bool = False) -> list[str]:
    """The container's `meshnet` command line (the single place to change it). `full`
    re-hashes files whose marker matches too, and fetches again what no longer matches."""
    args = ["artifact", "pull", "--artifact", f"{SPEC_DIR}/{SPEC_FILE}", "--dest", dest,
            "--summary-file", TERMINATION_LOG]
    return args + (["--source-dir", source_dir] if source_dir else []) + (
        ["--full"] if full else [])


def _on_node(node: str) -> dict[str, Any]:
    """Pinned to one node by name (as a DaemonSet's pods are), tolerating NoSchedule taints:
    the storage's nodeSelector chose it, e.g. a tainted GPU node."""
    term = {"matchFields": [{"key": HOSTNAME_FIELD, "operator": "In", "values": [node]}]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term]}}},
            "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}


def provisioning_job(ref: ArtifactRef, spec: ModelArtifactSpec, config: ProvisionerConfig,
                     node: str | None = None, rehash: str | None = None) -> dict[str, Any]:
    """The Job that provisions `spec` onto its storage (on `node` for a host path): non-root,
    read-only root filesystem, only the storage mount writable; restarted on failure up to
    the back-off limit; its summary is the container's termination message. With `rehash`
    (a round, see rehash_round) it is the full re-hash of an existing copy instead."""
    digest = spec_hash(spec)
    storage, dest = _storage(spec)
    source = _source(spec)
    volumes = [storage, {"name": "spec", "configMap": {
        "name": config_map_name(ref.name, digest), "defaultMode": 0o444}}]
    mounts = [{"name": "storage", "mountPath": STORAGE_DIR},
              {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True}]
    if source is not None:
        volumes.append(source)
        mounts.append({"name": "source", "mountPath": SOURCE_DIR, "readOnly": True})
    container = {
        "name": CONTAINER,
        "image": config.image,
        "command": ["meshnet"],
        "args": pull_args(dest, SOURCE_DIR if source is not None else None,
                          full=rehash is not None),
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": dict(config.requests), "limits": dict(config.limits)},
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": mounts,
    }
    pod: dict[str, Any] = {
        "restartPolicy": "OnFailure",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": dict(POD_SECURITY),
        "containers": [container],
        "volumes": volumes,
        **(_on_node(node) if node else {}),
    }
    annotations = {labels.ARTIFACT_ANNOTATION: ref.name,
                   labels.MANIFEST_ANNOTATION: spec.manifest_digest(),
                   **({labels.NODE_ANNOTATION: node} if node else {}),
                   **({labels.REHASH_ANNOTATION: rehash} if rehash else {})}
    name = (job_name(ref.name, digest, node) if rehash is None
            else rehash_job_name(ref.name, digest, node, rehash))
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": ref.namespace,
                     "labels": _labels(ref, digest), "annotations": annotations,
                     "ownerReferences": [owner_reference(ref)]},
        "spec": {
            "backoffLimit": config.backoff_limit,
            "completions": 1,
            "parallelism": 1,
            "template": {"metadata": {"labels": _labels(ref, digest),
                                      "annotations": annotations},
                         "spec": pod},
        },
    }
