"""The pure ModelArtifact planner: observed state + spec -> the children to create or
delete, the node labels to set or remove, the events and the new status. No I/O;
`meshnet.operator.artifact_handlers` carries the plan out
(`meshnet.operator.executor`).

Children have deterministic names derived from the spec (`jobspec.spec_hash`), so a spec
change means new children: the new Job provisions the new spec into staging beside the
files in use, and a node keeps its earlier manifest's Job and label (the pods there go on
serving those files) until its copy of the new spec verifies; then the old ones go.
Status is rebuilt from what the Jobs reported (`artifact_status`, `copies_status`), never
from the previous status; only condition transition times are carried over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from meshnet.api import labels
from meshnet.api.common import Condition
from meshnet.api.modelartifact import ModelArtifactSpec, ModelArtifactStatus, human_size
from meshnet.errors import ArtifactSpecError, StorageRefused
from meshnet.reconcile.artifact.copies import Copy, copies_status
from meshnet.reconcile.artifact.jobspec import (
    ArtifactRef,
    ProvisionerConfig,
    config_map_name,
    job_name,
    provisioning_job,
    spec_config_map,
    spec_hash,
)
from meshnet.reconcile.artifact.observed import Observed, ObservedJob, ObservedNode
from meshnet.reconcile.artifact.rehash import (
    CopyJobs,
    copy_jobs,
    due_round,
    repaired_bytes,
    verification,
)
from meshnet.reconcile.artifact.status import (
    FAILED,
    PROGRESSING,
    READY,
    RETRYING,
    artifact_status,
    node_copy,
)
from meshnet.reconcile.conditions import Verdict, stamp
from meshnet.reconcile.plan import Create, Delete, Event, Patch, Plan, Step

STATUS_KEYS = ("observedGeneration", "manifestDigest", "shortDigest", "size", "progress",
               "gguf", "nodes", "verification", "conditions")
OWN_CONDITIONS = (READY, PROGRESSING, FAILED)
FORBIDDEN_ROOT = "/home"
# Event reasons (a fixed set): children, node labels, and condition transitions.
STARTED, SUPERSEDED = "ProvisioningStarted", "ProvisioningSuperseded"
RETRYING_EVENT, FAILED_EVENT = "ProvisioningRetrying", "ProvisioningFailed"
VERIFIED_EVENT = "Verified"
REHASH_STARTED, REHASHED, REPAIRED = "RehashStarted", "Rehashed", "CopyRepaired"
LABELED, UNLABELED, INVALID = "NodeLabeled", "NodeUnlabeled", "InvalidSpec"


def plan_artifact(observed: Observed, config: ProvisionerConfig,
                  now: datetime) -> Plan:
    """One level-based step towards the spec; safe to repeat with the same inputs."""
    artifact = observed.artifact
    ref = ArtifactRef(artifact.name, artifact.namespace, artifact.uid)
    spec = artifact.spec
    if artifact.deleting:
        return Plan(steps=tuple(_teardown(observed, ref)))
    if spec is None:
        return _refused(observed, None, ArtifactSpecError.reason,
                        "; ".join(artifact.spec_errors), now)
    home = _under_home(spec)
    if home:
        return _refused(observed, spec, StorageRefused.reason, home, now)
    desired = _desired_jobs(ref, spec, observed.nodes, config)
    jobs = {j.name: j for j in observed.jobs}
    steps = _create_children(ref, spec, desired, jobs, observed.config_maps)
    digest = spec_hash(spec)
    copies = {node: copy_jobs(observed.jobs, name, digest, node)
              for name, (node, _) in desired.items()}
    for node, copy in copies.items():
        steps += _rehash_steps(ref, spec, config, node, copy, now)
    checks = {node: verification(copy, config.rehash_every) for node, copy in copies.items()}
    if spec.storage.host_path is None:
        record = copies[None].record
        status = artifact_status(spec, record.summary if record else None,
                                 record.phase if record else "Pending",
                                 generation=artifact.generation, now=now,
                                 previous_conditions=_previous(observed))
        status = status.model_copy(update={"verification": checks[None]})
        verified: set[str] = set()
    else:
        states = [_copy(node, copy.record) for node, copy in copies.items() if node is not None]
        status = copies_status(spec, states, generation=artifact.generation, now=now,
                               previous_conditions=_previous(observed))
        status = status.model_copy(update={"nodes": [
            n.model_copy(update={"verification": checks.get(n.node)}) for n in status.nodes]})
        verified = {c.node for c in states
                    if node_copy(c.node, spec, c.summary, c.phase).verified}
    # A pull replaces no file in place before every file verified: until then a node's
    # copy of an earlier manifest is whole, and its pods may be rescheduled onto it.
    pending = {node for node in copies if node is not None and node not in verified}
    steps += _label_steps(observed, spec.manifest_digest(), verified, pending)
    keep = set(desired) | {j.name for copy in copies.values() for j in copy.rehashes
                           if j not in copy.superseded()} | _vouching(observed, pending)
    steps += _delete_stale(observed, keep, config_map_name(ref.name, digest), frozenset(copies))
    return _finish(observed, status, tuple(steps), _rehash_events(observed, spec, copies))


def _vouching(observed: Observed, nodes: set[str]) -> set[str]:
    """The Jobs that verified the copies of earlier manifests still whole on `nodes`: kept
    (they name those manifests, whose node labels stay) until a later copy is verified
    there. Restoring that spec finds its Job done: nothing runs again."""
    current = _current_hash(observed)
    return {j.name for j in observed.jobs if j.node in nodes and j.phase == "Succeeded"
            and j.spec_hash != current}


def _copy(node: str | None, job: ObservedJob | None) -> Copy:
    assert node is not None
    return Copy(node, job.summary if job else None, job.phase if job else "Pending")


def _rehash_steps(ref: ArtifactRef, spec: ModelArtifactSpec, config: ProvisionerConfig,
                  node: str | None, copy: CopyJobs, now: datetime) -> list[Step]:
    round_ = due_round(copy, config.rehash_every, now)
    if round_ is None:
        return []
    body = provisioning_job(ref, spec, config, node, rehash=round_)
    checked = copy.record.finished_at if copy.record else "never"
    return [Step(Create(body), Event(
        "Normal", REHASH_STARTED,
        f"created Job {body['metadata']['name']}: re-hashing every byte of "
        f"{_where(spec, node)} (last checked {checked}; in between, files are trusted by "
        "size and mtime)"))]


def _rehash_events(observed: Observed, spec: ModelArtifactSpec,
                   copies: Mapping[str | None, CopyJobs]) -> tuple[Event, ...]:
    """One event per re-hash that finished since the status was written."""
    old = observed.artifact.status
    before: dict[str | None, str | None] = {
        None: (old.get("verification") or {}).get("checkedAt")}
    before.update({n.get("node"): (n.get("verification") or {}).get("checkedAt")
                   for n in old.get("nodes") or [] if isinstance(n, Mapping)})
    events = []
    for node, copy in copies.items():
        repaired = repaired_bytes(copy)
        record = copy.record
        if repaired is None or record is None or before.get(node) == record.finished_at:
            continue
        where = _where(spec, node)
        events.append(
            Event("Warning", REPAIRED, f"a full re-hash of {where} found damaged bytes and "
                  f"fetched {human_size(repaired)} again; the copy is verified")
            if repaired else
            Event("Normal", REHASHED, f"a full re-hash of {where} matched every byte"))
    return tuple(events)


def _under_home(spec: ModelArtifactSpec) -> str | None:
    """The CRD refuses it too; an API server without CEL must not get a copy there either."""
    host = spec.storage.host_path
    if host is not None and (host.path == FORBIDDEN_ROOT
                             or host.path.startswith(FORBIDDEN_ROOT + "/")):
        return (f"storage.hostPath.path {host.path} is under {FORBIDDEN_ROOT}: model "
                "artifacts are never placed there; use a PVC or another host path")
    return None


def selected_nodes(spec: ModelArtifactSpec, nodes: Sequence[ObservedNode]) -> list[str]:
    """Nodes that receive a host-path copy: those matching the storage's nodeSelector."""
    assert spec.storage.host_path is not None
    selector = spec.storage.host_path.node_selector
    return sorted(n.name for n in nodes
                  if all(n.labels.get(k) == v for k, v in selector.items()))


def _targets(spec: ModelArtifactSpec, nodes: Sequence[ObservedNode]) -> list[str | None]:
    """One Job for a PVC (no node), one per selected node for a host path."""
    if spec.storage.host_path is None:
        return [None]
    return list(selected_nodes(spec, nodes))


def _desired_jobs(ref: ArtifactRef, spec: ModelArtifactSpec, nodes: Sequence[ObservedNode],
                  config: ProvisionerConfig) -> dict[str, tuple[str | None, dict[str, Any]]]:
    """Job name -> (node, body)."""
    bodies = [(node, provisioning_job(ref, spec, config, node)) for node in _targets(spec, nodes)]
    return {body["metadata"]["name"]: (node, body) for node, body in bodies}


def _where(spec: ModelArtifactSpec, node: str | None) -> str:
    if spec.storage.pvc is not None:
        sub = f"/{spec.storage.pvc.sub_path}" if spec.storage.pvc.sub_path else ""
        return f"PVC {spec.storage.pvc.claim_name}{sub}"
    assert spec.storage.host_path is not None
    return f"{spec.storage.host_path.path} on node {node}"


def _create_children(ref: ArtifactRef, spec: ModelArtifactSpec,
                     desired: Mapping[str, tuple[str | None, dict[str, Any]]],
                     jobs: Mapping[str, ObservedJob], config_maps: Sequence[str]) -> list[Step]:
    steps: list[Step] = []
    if not desired:
        return steps
    config_map = spec_config_map(ref, spec)
    if config_map["metadata"]["name"] not in config_maps:
        steps.append(Step(Create(config_map)))
    digest = spec.manifest_digest()
    for name, (node, body) in desired.items():
        if name not in jobs:
            steps.append(Step(Create(body), Event(
                "Normal", STARTED,
                f"created Job {name}: provisioning manifest {digest[:12]} ({len(spec.files)} "
                f"files, {human_size(spec.total_bytes())}) into {_where(spec, node)}")))
    return steps


def _label_steps(observed: Observed, digest: str | None, verified: set[str],
                 unchanged: set[str] | frozenset[str] = frozenset()) -> list[Step]:
    """Label exactly the nodes holding a verified copy of this manifest; take the labels of
    this artifact's earlier manifests away, except on the nodes `unchanged` (no pull of a
    later manifest replaced their files yet: a spec with a wrong digest must not make the
    running epoch's pods unschedulable) and where another artifact's copy of the same
    bytes is complete (the label is by content)."""
    digests = {d for d in [*(j.manifest_digest for j in observed.jobs),
                           observed.artifact.status.get("manifestDigest")] if d}
    if digest:
        digests.add(digest)
    steps: list[Step] = []
    for node in observed.nodes:
        change: dict[str, str | None] = {}
        for each in sorted(digests):
            key = labels.artifact_node_label(each)
            has = node.labels.get(key) == labels.VERIFIED
            want = each == digest and node.name in verified
            if want and not has:
                change[key] = labels.VERIFIED
            elif has and not want and not (each != digest and node.name in unchanged) \
                    and node.name not in observed.claims.get(each, frozenset()):
                change[key] = None
        if change:
            added = sorted(k for k, v in change.items() if v)
            event = (Event("Normal", LABELED, f"node {node.name} holds a verified copy: "
                           f"labeled {', '.join(added)}={labels.VERIFIED}") if added else
                     Event("Normal", UNLABELED, f"node {node.name} no longer holds a verified "
                           f"copy of this artifact: removed {', '.join(sorted(change))}"))
            steps.append(Step(Patch("Node", node.name, {"metadata": {"labels": change}}), event))
    return steps


def _delete_stale(observed: Observed, keep: set[str], config_map: str | None,
                  copies_at: frozenset[str | None] = frozenset()) -> list[Step]:
    """Jobs of an earlier spec or of nodes no longer selected, re-hash Jobs that a later
    check of a copy still held (`copies_at`) superseded (quietly), and earlier specs'
    ConfigMaps."""
    steps = []
    current = _current_hash(observed)
    for job in observed.jobs:
        if job.name in keep:
            continue
        if job.rehash and job.spec_hash == current and job.node in copies_at:
            steps.append(Step(Delete("Job", job.name)))
            continue
        why = (f"node {job.node} is no longer selected" if job.node
               and job.spec_hash == current else "the spec changed")
        steps.append(Step(Delete("Job", job.name),
                          Event("Normal", SUPERSEDED, f"deleted Job {job.name}: {why}")))
    steps += [Step(Delete("ConfigMap", name)) for name in observed.config_maps
              if name != config_map]
    return steps


def _current_hash(observed: Observed) -> str | None:
    spec = observed.artifact.spec
    return spec_hash(spec) if spec is not None else None


def _teardown(observed: Observed, ref: ArtifactRef) -> list[Step]:
    """A deleted artifact: its node labels go first, then every child (also those the
    watch has not shown yet: their names are deterministic)."""
    steps = _label_steps(observed, None, set())
    spec = observed.artifact.spec
    jobs = {j.name for j in observed.jobs}
    maps = set(observed.config_maps)
    if spec is not None:
        digest = spec_hash(spec)
        jobs |= {job_name(ref.name, digest, node) for node in _targets(spec, observed.nodes)}
        maps.add(config_map_name(ref.name, spec_hash(spec)))
    steps += [Step(Delete("Job", name)) for name in sorted(jobs)]
    steps += [Step(Delete("ConfigMap", name)) for name in sorted(maps)]
    return steps


def _refused(observed: Observed, spec: ModelArtifactSpec | None, reason: str,
             message: str, now: datetime) -> Plan:
    """A spec that cannot be provisioned: no Jobs, Failed with the reason."""
    artifact = observed.artifact
    verdicts: list[Verdict] = [Verdict(READY, False, reason, message),
                               Verdict(PROGRESSING, False, reason, message),
                               Verdict(FAILED, True, reason, message)]
    conditions = stamp(verdicts, _previous(observed), artifact.generation, now)
    if spec is not None:
        status = artifact_status(spec, None, "Pending", generation=artifact.generation,
                                 now=now).model_copy(update={"conditions": conditions})
    else:
        status = ModelArtifactStatus(observed_generation=artifact.generation,
                                     conditions=conditions)
    # No Job runs for it, so the copies of earlier manifests stay as they are, labels too.
    unchanged = {node.name for node in observed.nodes}
    steps = _label_steps(observed, None, set(), unchanged) + \
        _delete_stale(observed, _vouching(observed, unchanged), None)
    result = _finish(observed, status, tuple(steps))
    if reason != ArtifactSpecError.reason:
        return result
    # An invalid spec is announced as InvalidSpec, again whenever the problems change.
    old = _old_conditions(observed).get(FAILED) or {}
    message = conditions[-1].message
    events = tuple(e for e in result.events if e.reason != FAILED_EVENT)
    if old.get("status") != "True" or old.get("message") != message:
        events = (Event("Warning", INVALID, message), *events)
    return Plan(result.steps, events, result.status, own_conditions=OWN_CONDITIONS)


def _previous(observed: Observed) -> list[Condition]:
    out = []
    for raw in _old_conditions(observed).values():
        try:
            out.append(Condition.model_validate(raw))
        except ValueError:
            continue  # a malformed old condition only loses its transition time
    return out


def _old_conditions(observed: Observed) -> dict[str, Mapping[str, Any]]:
    return {str(c["type"]): c for c in observed.artifact.status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") in OWN_CONDITIONS}


def _transitions(old: Mapping[str, Mapping[str, Any]],
                 new: Sequence[Condition]) -> tuple[Event, ...]:
    """Events for condition changes: Verified, ProvisioningRetrying, ProvisioningFailed."""
    now = {c.type: c for c in new}
    events = []
    ready, progressing, failed = now[READY], now[PROGRESSING], now[FAILED]
    before = {kind: (c.get("status"), c.get("reason")) for kind, c in old.items()}
    if ready.status == "True" and before.get(READY, (None,))[0] != "True":
        events.append(Event("Normal", VERIFIED_EVENT, ready.message))
    if progressing.reason == RETRYING and before.get(PROGRESSING, (None, None))[1] != RETRYING:
        events.append(Event("Warning", RETRYING_EVENT, progressing.message))
    if failed.status == "True" and before.get(FAILED) != ("True", failed.reason):
        events.append(Event("Warning", FAILED_EVENT, f"{failed.reason}: {failed.message}"))
    return tuple(events)


def _finish(observed: Observed, status: ModelArtifactStatus,
            steps: tuple[Step, ...], extra: tuple[Event, ...] = ()) -> Plan:
    """The new status (ours, plus other writers' conditions) and whether it changed."""
    old = observed.artifact.status
    new = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    theirs = [dict(c) for c in old.get("conditions") or []
              if isinstance(c, Mapping) and c.get("type") not in OWN_CONDITIONS]
    new["conditions"] = new.get("conditions", []) + theirs
    changed = any(old.get(k) != new.get(k) for k in STATUS_KEYS)
    events = _transitions(_old_conditions(observed), status.conditions) + extra
    return Plan(steps, events, new if changed else None, own_conditions=OWN_CONDITIONS)
