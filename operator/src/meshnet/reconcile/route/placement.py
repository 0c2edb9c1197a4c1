"""Placement from measured links for a ShardRoute (pure): when to measure the links between
the nodes its stages run on, what status.placement shows of the result, and which node each
stage is pinned to.

Measuring: one probe-agent pod per node, then a Job measuring them (probespec.py builds
both; the Job hands the links back as its termination message, as the certification Job
hands back its certificate). The links are kept in status; the placement arithmetic,
`meshnet.placement.order` on them, is redone on every reconcile. Agents and Job are deleted
once the links are read.

Placing (spec.placement Measured, one replica): the stages are reassigned to the nodes in
the best order only when it saves at least MARGIN of the current order's network time per
token and at least MIN_GAIN_SECONDS, so measurement noise never flaps the route. Stages the
user pinned (nodeSelector or nodeAffinity) keep their node. The planner pins each other
stage to its node and a changed assignment starts a new epoch (planner.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from meshnet.api.shardroute import ShardRouteSpec, Stage
from meshnet.placement.order import MeasuredLink, PlacementError, cycle, place
from meshnet.placement.report import ReportError, read_links
from meshnet.reconcile.plan import Action, Create, Delete, Event
from meshnet.reconcile.route.podspec import RouteRef
from meshnet.reconcile.route.probespec import (
    NODE,
    NODES_KEY,
    ROW_BYTES,
    PlacementConfig,
    agent_pod,
    measuring_job,
    on_node,
    token_name,
    token_secret,
)
from meshnet.timestamps import parse_rfc3339, rfc3339

MARGIN = 0.10  # the best order must save 10% of the current order's network time ...
MIN_GAIN_SECONDS = 0.001  # ... and at least 1 ms per token


@dataclass(frozen=True)
class ObservedAgent:
    name: str
    node: str
    ip: str = ""
    ready: bool = False


@dataclass(frozen=True)
class ObservedMeasurement:
    """The measuring Job: finished with the links document, or with why not."""

    name: str
    nodes_key: str
    finished: bool = False
    result: str = ""  # its container's termination message


@dataclass(frozen=True)
class ObservedProbes:
    agents: tuple[ObservedAgent, ...] = ()
    jobs: tuple[ObservedMeasurement, ...] = ()
    token_secret: str | None = None  # the token Secret's name, once it exists
    fresh_token: str = ""  # a new random token, used only to create that Secret


@dataclass(frozen=True)
class PlacementPlan:
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    status: dict[str, Any] | None = None  # status.placement; None: none
    assignment: Mapping[str, str] = field(default_factory=dict)  # stage -> node to pin
    requeue_after: float | None = None


def pinned(stage: Stage) -> bool:
    """The user chose the stage's nodes: the operator leaves it where it is."""
    return bool(stage.node_selector) or bool((stage.affinity or {}).get("nodeAffinity"))


def nodes_key(nodes: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(nodes)).encode()).hexdigest()[:16]


def plan_placement(route: RouteRef, spec: ShardRouteSpec, old: Mapping[str, Any] | None,
                   nodes: Mapping[str, str] | None, probes: ObservedProbes, now: datetime,
                   config: PlacementConfig,
                   unschedulable: frozenset[str] = frozenset()) -> PlacementPlan:
    """One reconcile's placement. `old`: status.placement; `nodes`: stage -> node of the
    serving pipeline, None while it is not all scheduled or the route is rolling out;
    `unschedulable`: stages whose pod of the current epoch the scheduler cannot place."""
    old = dict(old or {})
    applied = dict(old.get("assignment") or {})
    if spec.placement == "Static":
        return PlacementPlan(actions=cleanup(probes))
    if stuck := sorted(unschedulable & set(applied)):
        # its node is gone or full: a pin must not keep a stage down (a new epoch unpins all)
        return _keep(old, {}, probes, "WaitingForNodes",
                     f"stage {', '.join(stuck)} cannot be scheduled on its assigned node:"
                     " the stages are left to the scheduler until measured again")
    if spec.replicas != 1:
        return _keep(old, applied, probes, "ReplicasUnsupported",
                     f"Measured placement orders one pipeline; the route has {spec.replicas}"
                     " replicas (nothing is measured or reassigned; replica 0 keeps the"
                     " nodes it was assigned, the others are the scheduler's)")
    if nodes is None or any(s.name not in nodes for s in spec.stages):
        if old.get("reason") == "Reassigned":  # its new epoch rolls out: say so until done
            return _keep(old, applied, probes, "Reassigned", str(old.get("message", "")))
        return _keep(old, applied, probes, "WaitingForNodes",
                     "waiting for every stage pod of the epoch to run on a node")
    order = [nodes[s.name] for s in spec.stages]
    machines = sorted(set(order))
    if len(machines) != len(order):
        return _keep(old, applied, probes, "WaitingForNodes",
                     "stages share a node: there is no order of distinct nodes to choose")
    if config.image is None:
        return _keep(old, applied, probes, "MeasurementFailed",
                     "the operator has no image for probe agents (MESHNET_GATEWAY_IMAGE)")
    key = nodes_key(machines)
    same_nodes = sorted(old.get("nodes") or []) == machines
    measured_at = parse_rfc3339(old.get("measuredAt") or "") if same_nodes else None
    if measured_at and now - measured_at < timedelta(seconds=config.interval_seconds):
        left = config.interval_seconds - (now - measured_at).total_seconds()
        return _placed(spec, order, old, applied, probes, left)
    attempted = parse_rfc3339(old.get("attemptedAt") or "") if same_nodes else None
    if old.get("reason") == "MeasurementFailed" and attempted \
            and now - attempted < timedelta(seconds=config.retry_seconds):
        left = config.retry_seconds - (now - attempted).total_seconds()
        return _keep(old, applied, probes, "MeasurementFailed", str(old.get("message", "")),
                     left)
    return _measuring(route, spec, order, machines, old, applied, probes, now, config, key)


def _measuring(route: RouteRef, spec: ShardRouteSpec, order: list[str], machines: list[str],
               old: dict[str, Any], applied: dict[str, str], probes: ObservedProbes,
               now: datetime, config: PlacementConfig, key: str) -> PlacementPlan:
    """Agents on every node, then the Job; its result read once it finished."""
    job = next((j for j in probes.jobs if j.nodes_key == key), None)
    stale: list[Action] = [Delete("Job", j.name) for j in probes.jobs if j.nodes_key != key]
    if job is not None and job.finished:
        done = [*stale, *cleanup(probes)]
        try:
            found, links = read_links(job.result)
        except ReportError:
            why = (job.result.strip().splitlines() or ["the Job ended without a result"])[-1]
            failed = {**old, "reason": "MeasurementFailed", "nodes": machines,
                      "message": f"measuring Job {job.name} failed: {why[:512]}",
                      "attemptedAt": rfc3339(now)}
            return PlacementPlan(tuple(done), (Event("Warning", "MeasurementFailed",
                                                     failed["message"]),),
                                 failed, applied, config.retry_seconds)
        measured = {"nodes": sorted(found), "measuredAt": rfc3339(now),
                    "attemptedAt": old.get("attemptedAt"),
                    "links": [{"fromNode": a, "toNode": b, "rttSeconds": link.rtt_s,
                               "bytesPerSecond": link.bytes_per_s}
                              for (a, b), link in sorted(links.items())]}
        placed = _placed(spec, order, measured, applied, ObservedProbes(),
                         config.interval_seconds)
        return PlacementPlan(tuple(done), placed.events, placed.status, placed.assignment,
                             placed.requeue_after)
    actions: list[Action] = stale
    if probes.token_secret is None:
        actions.append(Create(token_secret(route, probes.fresh_token)))
    by_node = {a.node: a for a in probes.agents}
    actions += [Create(agent_pod(route, node, config, probes.token_secret or
                                 token_name(route.name)))
                for node in machines if node not in by_node]
    actions += [Delete("Pod", a.name) for a in probes.agents if a.node not in machines]
    ready = [by_node[n] for n in machines if n in by_node and by_node[n].ready and by_node[n].ip]
    started = parse_rfc3339(old.get("attemptedAt") or "") \
        if old.get("reason") == "Measuring" else None
    if started and now - started > timedelta(seconds=2 * config.deadline_seconds):
        waiting = [n for n in machines if n not in {a.node for a in ready}]
        why = f"no ready probe agent on {', '.join(waiting)}" if waiting and job is None \
            else "the measuring Job did not finish"
        failed = {**old, "reason": "MeasurementFailed", "nodes": machines,
                  "message": f"{why} in {2 * config.deadline_seconds} s",
                  "attemptedAt": rfc3339(now)}
        return PlacementPlan((*stale, *cleanup(probes)), (Event(
            "Warning", "MeasurementFailed", failed["message"]),), failed, applied,
            config.retry_seconds)
    status = {**old, "reason": "Measuring", "attemptedAt": rfc3339(started or now),
              "message": f"measuring the links between {len(machines)} nodes"}
    if job is None and len(ready) == len(machines) and probes.token_secret:
        actions.append(Create(measuring_job(route, spec, {a.node: a.ip for a in ready},
                                            config, key, probes.token_secret)))
    return PlacementPlan(tuple(actions), (), _clean(status), applied,
                         2 * config.deadline_seconds)


def _placed(spec: ShardRouteSpec, order: list[str], measured: Mapping[str, Any],
            applied: dict[str, str], probes: ObservedProbes,
            requeue: float | None) -> PlacementPlan:
    """The best order of the measured nodes against the current one, and the assignment."""
    links = {(x["fromNode"], x["toNode"]): _link(x) for x in measured.get("links") or []}
    topology = "chain" if spec.recipe.topology == "chain" else "ring"
    fixed = {i: order[i] for i, s in enumerate(spec.stages) if pinned(s)}
    figures = {k: measured.get(k) for k in ("measuredAt", "attemptedAt", "nodes", "links")}
    try:
        best = place(order, links, ROW_BYTES, topology, gateways=order, fixed=fixed)
        current = sum(s for _, _, s in cycle(order, links, ROW_BYTES, topology))
    except PlacementError as error:
        status = {**figures, "reason": "MeasurementFailed", "message": str(error),
                  "assignment": applied}
        return PlacementPlan(cleanup(probes), (), _clean(status), applied, requeue)
    status = {**figures, "currentOrder": order, "currentSeconds": round(current, 6),
              "bestOrder": list(best.order), "bestSeconds": round(best.cycle_s, 6),
              "gateway": best.gateway}
    gain = current - best.cycle_s
    ms = f"{current * 1000:.2f} ms per token in the current order, {best.cycle_s * 1000:.2f}" \
         " ms in the best"
    if len(fixed) == len(order):
        return PlacementPlan(cleanup(probes), (), _clean(
            {**status, "reason": "AllStagesPinned", "assignment": applied,
             "message": f"{ms}; every stage is pinned by its nodeSelector or nodeAffinity"}),
            applied, requeue)
    if spec.recipe.topology == "hub":
        reason, message = "Measured", f"{ms}; a hub route's stages are each called by the" \
                                      " gateway: their order costs nothing to change"
        best_is_worth = False
    else:
        best_is_worth = gain >= max(MIN_GAIN_SECONDS, MARGIN * current)
        reason = "Reassigned" if best_is_worth else "Measured"
        message = ms + ("; the stages are reassigned as a new epoch" if best_is_worth else
                        f" (reassigned only when it saves at least {MARGIN:.0%} and"
                        f" {MIN_GAIN_SECONDS * 1000:.0f} ms)")
    assignment = applied
    events: tuple[Event, ...] = ()
    if best_is_worth:
        assignment = {s.name: best.order[i] for i, s in enumerate(spec.stages) if i not in fixed}
        events = (Event("Normal", "StagesReassigned", f"{ms}: stages to nodes " + ", ".join(
            f"{s.name}={best.order[i]}" for i, s in enumerate(spec.stages))),)
    return PlacementPlan(cleanup(probes), events, _clean(
        {**status, "reason": reason, "message": message, "assignment": assignment}),
        assignment, requeue)


def _keep(old: dict[str, Any], applied: dict[str, str], probes: ObservedProbes, reason: str,
          message: str, requeue: float | None = None) -> PlacementPlan:
    """No measuring now: the figures measured before stay, with why."""
    return PlacementPlan(cleanup(probes), (), _clean(
        {**old, "reason": reason, "message": message, "assignment": applied}),
        applied, requeue)


def _clean(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if v not in (None, [], {})}


def _link(row: Mapping[str, Any]) -> MeasuredLink:
    return MeasuredLink(float(row["rttSeconds"]), float(row["bytesPerSecond"]))


def cleanup(probes: ObservedProbes) -> tuple[Action, ...]:
    """Agents and Jobs go once nothing is measured (the token Secret stays for the next)."""
    return (*(Delete("Pod", a.name) for a in probes.agents),
            *(Delete("Job", j.name) for j in probes.jobs))


def assigned_stage(stage: Stage, node: str | None) -> Stage:
    """The stage pinned to `node` by name (required node affinity); itself without one."""
    if node is None:
        return stage
    return stage.model_copy(update={"affinity": {**(stage.affinity or {}),
                                                 **on_node(node)}})


def observe_agent(body: Mapping[str, Any]) -> ObservedAgent:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return ObservedAgent(meta.get("name", ""), (meta.get("annotations") or {}).get(NODE, ""),
                         str(status.get("podIP") or ""), conditions.get("Ready") == "True")


def observe_measurement(job: Mapping[str, Any],
                        pods: Sequence[Mapping[str, Any]]) -> ObservedMeasurement:
    """The Job with its pod's termination message: finished once it failed, or once it
    completed and the message is seen (the pod's watch may lag the Job's)."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    done = {c.get("type") for c in status.get("conditions") or []
            if c.get("status") == "True"}
    messages = [term.get("message", "") for pod in pods
                for cs in (pod.get("status") or {}).get("containerStatuses") or []
                if (term := (cs.get("state") or {}).get("terminated"))]
    failed = "Failed" in done or bool(status.get("failed"))
    completed = "Complete" in done or bool(status.get("succeeded"))
    conditions = [c.get("message", "") for c in status.get("conditions") or []
                  if c.get("type") == "Failed"]
    return ObservedMeasurement(meta.get("name", ""), (meta.get("labels") or {}).get(
        NODES_KEY, ""), failed or (completed and bool(messages)),
        (messages or conditions or [""])[-1])
