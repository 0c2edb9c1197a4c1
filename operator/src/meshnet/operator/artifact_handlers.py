"""Thin kopf handlers for ModelArtifacts: every trigger (create, update, resume, timer,
delete, an event of one of its provisioning Jobs or their pods, a node's labels changing)
runs the same level-based reconcile: observe -> `plan_artifact` -> execute."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from meshnet.api import labels, modelartifact
from meshnet.operator.context import Context
from meshnet.operator.executor import execute, owner_path
from meshnet.operator.handlers import ARTIFACTS
from meshnet.operator.registration import on_every_trigger, run_reconcile
from meshnet.reconcile.artifact.jobspec import ProvisionerConfig
from meshnet.reconcile.artifact.observed import (
    Observed,
    ObservedJob,
    observe_artifact,
    observe_attempts,
    observe_job,
    observe_node,
    with_attempts,
)
from meshnet.reconcile.artifact.planner import STATUS_KEYS, plan_artifact
from meshnet.timestamps import utc_now

log = logging.getLogger(__name__)
KIND = modelartifact.KIND
JOBS = ("batch", "v1", "jobs")
PROVISIONING: dict[str, Any] = {labels.ARTIFACT: kopf.PRESENT,
                                labels.MANAGED_BY: labels.OPERATOR_NAME}
# Handlers take `labels`/`annotations` kwargs, which would shadow the module inside them.
ARTIFACT_NOTE = labels.ARTIFACT_ANNOTATION
JOB_NAME = labels.JOB_NAME


async def reconcile_artifact(ctx: Context, config: ProvisionerConfig, namespace: str,
                             name: str, indices: Mapping[str, Any]) -> None:
    """observe -> plan -> execute for one artifact."""
    async def once() -> None:
        await _reconcile_once(ctx, config, namespace, name, indices)

    await run_reconcile(ctx, KIND, (KIND, namespace, name), once)  # apart from a route's


async def _reconcile_once(ctx: Context, config: ProvisionerConfig, namespace: str, name: str,
                          indices: Mapping[str, Any]) -> None:
    body = await ctx.client.get(owner_path(modelartifact.PLURAL, namespace, name))  # status
    if body is None:
        ctx.metrics.status.artifact((namespace, name), None)
        return
    observed = observe(body, indices)
    result = plan_artifact(observed, config, utc_now())
    await execute(ctx.client, body, modelartifact.PLURAL, result, STATUS_KEYS)
    ctx.metrics.status.artifact((namespace, name), None if observed.artifact.deleting
                                else result.status or body.get("status") or {})


def observe(body: Mapping[str, Any], indices: Mapping[str, Any]) -> Observed:
    """The artifact, its Jobs with their latest summaries, its ConfigMaps, every node, and
    the nodes where other artifacts hold complete copies (by manifest digest)."""
    artifact = observe_artifact(body)
    key = (artifact.namespace, artifact.name)
    attempts = indices["artifact_job_attempts"]
    jobs = tuple(
        with_attempts(job, (a for pod in attempts.get((artifact.namespace, job.name), ())
                            for a in pod))
        for job in indices["artifact_jobs"].get(key, ()))
    claims: dict[str, set[str]] = {}
    for other, found in indices["artifact_jobs"].items():
        for job in found if other != key else ():
            if job.node and job.phase == "Succeeded":
                claims.setdefault(job.manifest_digest, set()).add(job.node)
    return Observed(
        artifact, jobs=jobs,
        config_maps=tuple(indices["artifact_config_maps"].get(key, ())),
        nodes=tuple(sorted((n for found in indices["artifact_nodes"].values() for n in found),
                           key=lambda n: n.name)),
        claims={digest: frozenset(nodes) for digest, nodes in claims.items()},
    )


def register(registry: kopf.OperatorRegistry, ctx: Context) -> None:
    """Register the ModelArtifact handlers on `registry`, bound to `ctx`; without a
    provisioner image nothing is registered (artifact status is then someone else's).
    kopf names handlers by qualified name: these must differ from `handlers.register`'s."""
    image = ctx.settings.provisioner_image
    if not image:
        log.warning("MESHNET_PROVISIONER_IMAGE is not set: ModelArtifacts are not provisioned"
                    " by this operator (their status is taken as written)")
        return
    config = ctx.settings.provisioner_config(image)
    node_labels: dict[str, Mapping[str, str]] = {}

    async def reconcile(namespace: str | None, name: str, indices: Mapping[str, Any]) -> None:
        await reconcile_artifact(ctx, config, namespace or "", name, indices)

    @kopf.index(*JOBS, labels=PROVISIONING, id="artifact_jobs", registry=registry)
    async def artifact_jobs(namespace: str | None, body: kopf.Body, **_: Any) -> Any:
        job: ObservedJob | None = observe_job(body)
        return {(namespace, job.artifact): job} if job else None

    @kopf.index("pods", labels={**PROVISIONING, JOB_NAME: kopf.PRESENT},
                id="artifact_job_attempts", registry=registry)
    async def artifact_job_attempts(namespace: str | None, labels: kopf.Labels, body: kopf.Body,
                                    **_: Any) -> Any:
        return {(namespace, labels[JOB_NAME]): observe_attempts(body)}

    @kopf.index("configmaps", labels=PROVISIONING, id="artifact_config_maps",
                registry=registry)
    async def artifact_config_maps(namespace: str | None, name: str, annotations: kopf.Annotations,
                                   **_: Any) -> Any:
        return {(namespace, annotations[ARTIFACT_NOTE]): name} \
            if ARTIFACT_NOTE in annotations else None

    @kopf.index("nodes", id="artifact_nodes", registry=registry)
    async def artifact_nodes(name: str, body: kopf.Body, **_: Any) -> Any:
        return {name: observe_node(body)}

    @kopf.index(*ARTIFACTS, id="host_path_artifacts", registry=registry)
    async def host_path_artifacts(namespace: str | None, name: str, spec: kopf.Spec,
                                  **_: Any) -> Any:
        return {(namespace, name): "hostPath" in (spec.get("storage") or {})}

    @on_every_trigger(registry, ARTIFACTS, ctx.settings.resync_seconds)
    async def provision_artifact(namespace: str | None, name: str, **kwargs: Any) -> None:
        await reconcile(namespace, name, kwargs)

    @kopf.on.event(*JOBS, labels=PROVISIONING, registry=registry)
    async def provisioning_job_changed(namespace: str | None, annotations: kopf.Annotations,
                          **kwargs: Any) -> None:
        if ARTIFACT_NOTE in annotations:
            await reconcile(namespace, annotations[ARTIFACT_NOTE], kwargs)

    @kopf.on.event("pods", labels={**PROVISIONING, JOB_NAME: kopf.PRESENT}, registry=registry)
    async def provisioning_pod_changed(namespace: str | None, annotations: kopf.Annotations,
                              **kwargs: Any) -> None:
        if ARTIFACT_NOTE in annotations:
            await reconcile(namespace, annotations[ARTIFACT_NOTE], kwargs)

    @kopf.on.event("nodes", registry=registry)
    async def node_labels_changed(name: str, type: str | None, labels: kopf.Labels,
                           **kwargs: Any) -> None:
        """A node added, removed or relabelled may change which nodes get a copy."""
        now: Mapping[str, str] | None = None if type == "DELETED" else dict(labels)
        before = node_labels.pop(name, None)
        if now is not None:
            node_labels[name] = now
        if now == before or (type is None and before is None):
            return  # unchanged, or the initial listing (resume handlers cover that)
        for (namespace, artifact), found in list(kwargs["host_path_artifacts"].items()):
            if any(found):
                await reconcile(namespace, artifact, kwargs)
