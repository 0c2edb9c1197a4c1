"""The certification Job the operator creates when a route is Ready on a lane without a
certificate, and the reading of its outcome (pure: no I/O).

The Job runs `meshnet certify` against the route's stage pods, with the unsplit reference
started inside the Job's pod: the same node placement, resources and model volume as the
route's first stage pod, plus the lane's GPU product as a node selector. Its certificate
comes back as the container's termination message, so the Job needs no API access.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from meshnet.api import labels
from meshnet.api.certification import Certificate, CertifiedLane
from meshnet.api.common import GROUP
from meshnet.certify.gates import Gates
from meshnet.certify.lane import GPU_PRODUCT_LABELS, UNKNOWN
from meshnet.digests import canonical_digest
from meshnet.reconcile.naming import child_name
from meshnet.reconcile.route.identity import (
    CERTIFY,
    ROUTE_KEY_VOLUME,
    STAGE,
    TLS_VOLUME,
    stage_server_name,
)
from meshnet.reconcile.route.podspec import RouteRef, owner_reference

CERTIFY_ROUTE = labels.CERTIFY_ROUTE
LANE = f"{GROUP}/lane"
RECERTIFY = f"{GROUP}/recertify"  # annotation on the route: a new value runs a new Job
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
TERMINATION_LOG = "/dev/termination-log"
WORK_DIR = "/tmp"


def job_name(route: str, lane: CertifiedLane, request: str | None) -> str:
    """One Job per route, lane and recertify request: recreated for nothing else."""
    return child_name(route, "certify", canonical_digest([lane.key(), request or ""])[:10])


@dataclass(frozen=True)
class JobInputs:
    route: RouteRef
    lane: CertifiedLane
    stage_pod: Mapping[str, Any]  # a current stage pod: placement, resources, model volume
    endpoints: Sequence[str]  # the stages, in pipeline order
    image: str
    gates: Gates
    route_digest: str | None
    epoch: int
    request: str | None = None
    deadline_seconds: int = 3600


def certification_job(inputs: JobInputs) -> dict[str, Any]:
    pod = inputs.stage_pod["spec"]
    worker = pod["containers"][0]
    args = worker["args"]
    model = args[args.index("--model") + 1]
    tags = {labels.MANAGED_BY: labels.OPERATOR_NAME, CERTIFY_ROUTE: inputs.route.name,
            LANE: inputs.lane.key()[:16]}
    command = ["certify", *(a for e in inputs.endpoints for a in ("--stage", e)),
               "--model", model, "--backend", inputs.lane.backend,
               "--gpu-product", inputs.lane.gpu_product,
               "--manifest-digest", inputs.lane.manifest_digest,
               "--recipe-digest", inputs.lane.recipe_digest, "--epoch", str(inputs.epoch),
               "--verify-rows", str(inputs.lane.verify_rows),
               "--sessions", str(inputs.lane.sessions), "--batching", inputs.lane.batching,
               *inputs.gates.args(), "--termination-log", TERMINATION_LOG, "--json"]
    if inputs.route_digest:
        command += ["--route-digest", inputs.route_digest]
    if inputs.request:
        command += ["--request", inputs.request]
    # The stages' own volumes: the model, the route key, and for a TLS route its Secret,
    # whose CA the certifier trusts and whose certificate it presents where stages require
    # one (mTLS): from the operator's identity Secret, certification's own identity.
    shared = ("model", TLS_VOLUME, ROUTE_KEY_VOLUME)
    mounts = [m for m in worker.get("volumeMounts", []) if m["name"] in shared]
    volumes = [_as_certifier(v) for v in pod.get("volumes", []) if v["name"] in shared]
    tls_dir = next((m["mountPath"] for m in mounts if m["name"] == TLS_VOLUME), None)
    if "--route-key-file" in args:
        command += ["--route-key-file", args[args.index("--route-key-file") + 1]]
    if tls_dir:
        command += ["--tls-ca", f"{tls_dir}/ca.crt"]
        if "--tls-client-ca" in args:
            command += ["--tls-cert", f"{tls_dir}/tls.crt", "--tls-key", f"{tls_dir}/tls.key"]
        if any(v["name"] == TLS_VOLUME and (v.get("secret") or {}).get("items")
               for v in volumes):  # the operator's identity: it names the stages so
            command += ["--tls-server-name",
                        stage_server_name(inputs.route.name, inputs.route.namespace)]
    container = {
        "name": "certify", "image": inputs.image, "command": ["meshnet"], "args": command,
        "imagePullPolicy": worker.get("imagePullPolicy", "IfNotPresent"),
        "resources": worker.get("resources", {}),
        "securityContext": worker.get("securityContext", {}),
        "env": [{"name": "MESHNET_CACHE", "value": f"{WORK_DIR}/meshnet"},
                {"name": "HOME", "value": WORK_DIR},
                {"name": "MESHNET_BIN_DIR", "value": "/usr/local/bin"}],
        "volumeMounts": [*mounts, {"name": "work", "mountPath": WORK_DIR}],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod.get("securityContext", {}),
        "nodeSelector": {**pod.get("nodeSelector", {}), **_product_selector(inputs.lane)},
        "tolerations": pod.get("tolerations", []),
        "containers": [container],
        "volumes": [*volumes, {"name": "work", "emptyDir": {}}],
    }
    if pod.get("affinity"):
        spec["affinity"] = pod["affinity"]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": job_name(inputs.route.name, inputs.lane, inputs.request),
            "namespace": inputs.route.namespace, "labels": tags,
            "annotations": {LANE: inputs.lane.model_dump_json(by_alias=True)},
            "ownerReferences": [owner_reference(inputs.route)],
        },
        "spec": {
            "backoffLimit": 0,  # a failed gate is an answer, not a flake to retry
            "activeDeadlineSeconds": inputs.deadline_seconds,
            "ttlSecondsAfterFinished": 86400,  # its certificate is in the route's status
            "template": {"metadata": {"labels": tags}, "spec": spec},
        },
    }


def _as_certifier(volume: Mapping[str, Any]) -> dict[str, Any]:
    """A stage pod's volume as the Job mounts it: the stage identity's files of the
    operator's identity Secret become certification's."""
    items = (volume.get("secret") or {}).get("items")
    if volume["name"] != TLS_VOLUME or not items:
        return dict(volume)
    stage_files = {f"{STAGE}.crt": f"{CERTIFY}.crt", f"{STAGE}.key": f"{CERTIFY}.key"}
    return {**volume, "secret": {**volume["secret"], "items": [
        {**item, "key": stage_files.get(item["key"], item["key"])} for item in items]}}


def _product_selector(lane: CertifiedLane) -> dict[str, str]:
    """Run where the route runs: on the lane's GPU product, when it is one known product."""
    keys = GPU_PRODUCT_LABELS.get(lane.backend, ())
    if not keys or lane.gpu_product == UNKNOWN or "+" in lane.gpu_product:
        return {}
    return {keys[0]: lane.gpu_product}


@dataclass(frozen=True)
class JobOutcome:
    """finished: the Job is done; certificate: what it certified (None: it could not)."""

    finished: bool
    certificate: Certificate | None = None
    error: str = ""


def job_outcome(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> JobOutcome:
    """The Job's result from its status and its pod's termination message."""
    status = job.get("status") or {}
    done = {c.get("type") for c in status.get("conditions") or []
            if c.get("status") == "True"} & {"Complete", "Failed"}
    if not (done or status.get("succeeded") or status.get("failed")):
        return JobOutcome(finished=False)
    messages = [term.get("message", "") for pod in pods
                for cs in (pod.get("status") or {}).get("containerStatuses") or []
                if (term := (cs.get("state") or {}).get("terminated"))]
    for message in messages:
        try:
            return JobOutcome(True, Certificate.model_validate(json.loads(message)))
        except (ValueError, ValidationError):
            continue
    why = (messages[-1].strip().splitlines() or [""])[-1] if messages else ""
    conditions = [c.get("message", "") for c in status.get("conditions") or []
                  if c.get("type") == "Failed"]
    return JobOutcome(True, error=why or "; ".join(conditions) or "the Job failed without"
                                                                    " a certificate")
