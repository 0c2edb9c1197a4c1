"""Gauges of the status the operator last derived for each ShardRoute and ModelArtifact.

A collector, read at scrape time: a route or artifact that is gone leaves no stale
series, and every series carries only bounded labels (namespace, route or artifact,
stage or node, and fixed condition/status/state values)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

Key = tuple[str, str]  # (namespace, name)
STATUSES = ("True", "False", "Unknown")
ROUTE_CONDITIONS = ("Ready", "Progressing", "Degraded", "Certified")
ARTIFACT_CONDITIONS = ("Ready", "Progressing", "Failed")
NO_CERTIFICATE = "None"  # the state of a route whose Certified condition is not written yet


def _conditions(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in status.get("conditions") or []}


def _condition_family(name: str, documentation: str, kind: str, kinds: tuple[str, ...],
                      statuses: Mapping[Key, Mapping[str, Any]]) -> GaugeMetricFamily:
    """kube-state-metrics' shape: one series per status, 1 for the one that holds."""
    family = GaugeMetricFamily(name, documentation,
                               labels=["namespace", kind, "condition", "status"])
    for (namespace, object_name), status in sorted(statuses.items()):
        found = _conditions(status)
        for condition in kinds:
            holds = str((found.get(condition) or {}).get("status", "Unknown"))
            for value in STATUSES:
                family.add_metric([namespace, object_name, condition, value],
                                  1.0 if holds == value else 0.0)
    return family


def _coverage_ratio(status: Mapping[str, Any]) -> float | None:
    """'0-30/30' -> 1.0: the layers the stages cover, out of the model's block count."""
    try:
        span, total = str(status["coverage"]).split("/")
        first, last = span.split("-")
        return (int(last) - int(first)) / int(total)
    except (KeyError, ValueError, ZeroDivisionError):
        return None  # no stages yet, or the block count is not known ('?')


class StatusCollector(Collector):
    """Holds the latest status per object; `collect()` turns them into metric families."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes: dict[Key, Mapping[str, Any]] = {}
        self._artifacts: dict[Key, Mapping[str, Any]] = {}

    def route(self, key: Key, status: Mapping[str, Any] | None) -> None:
        """Record a route's status (None: the route is gone)."""
        with self._lock:
            if status is None:
                self._routes.pop(key, None)
            else:
                self._routes[key] = status

    def artifact(self, key: Key, status: Mapping[str, Any] | None) -> None:
        """Record an artifact's status (None: the artifact is gone)."""
        with self._lock:
            if status is None:
                self._artifacts.pop(key, None)
            else:
                self._artifacts[key] = status

    def collect(self) -> Iterable[Any]:
        with self._lock:
            routes, artifacts = dict(self._routes), dict(self._artifacts)
        yield from self._route_families(routes)
        yield from self._artifact_families(artifacts)

    @staticmethod
    def _route_families(routes: Mapping[Key, Mapping[str, Any]]) -> Iterable[Any]:
        yield _condition_family("meshnet_route_condition",
                                "ShardRoute conditions: 1 for the status that holds.",
                                "route", ROUTE_CONDITIONS, routes)
        labels = ["namespace", "route"]
        epoch = GaugeMetricFamily("meshnet_route_epoch", "ShardRoute status.epoch.",
                                  labels=labels)
        stages = GaugeMetricFamily("meshnet_route_stages", "Stages in the route's spec.",
                                   labels=labels)
        ready = GaugeMetricFamily("meshnet_route_stages_ready",
                                  "Stages whose pod of the current epoch is ready.",
                                  labels=labels)
        coverage = GaugeMetricFamily("meshnet_route_coverage_ratio",
                                     "Layers the stages cover, as a share of the model's.",
                                     labels=labels)
        certification = GaugeMetricFamily(
            "meshnet_route_certification",
            "1 for the route's certification state (the Certified condition's reason).",
            labels=[*labels, "state"])
        stage_ready = GaugeMetricFamily("meshnet_stage_ready",
                                        "1 when the stage's pod of the current epoch is ready.",
                                        labels=[*labels, "stage"])
        restarts = CounterMetricFamily("meshnet_stage_restarts",
                                       "Restarts of the stage's current worker pod.",
                                       labels=[*labels, "stage"])
        replicas = GaugeMetricFamily("meshnet_route_replicas",
                                     "Replicas (pipelines) the route asks for: spec.replicas.",
                                     labels=labels)
        replicas_ready = GaugeMetricFamily("meshnet_route_replicas_ready",
                                           "Replicas whose every stage pod is ready.",
                                           labels=labels)
        for (namespace, name), status in sorted(routes.items()):
            values = [namespace, name]
            entries = list(status.get("stages") or [])
            epoch.add_metric(values, float(status.get("epoch") or 0))
            if "replicaStatuses" in status:  # one entry per replica asked for
                replicas.add_metric(values, float(len(status["replicaStatuses"])))
                replicas_ready.add_metric(values, float(status.get("readyReplicas") or 0))
            stages.add_metric(values, float(len(entries)))
            ready.add_metric(values, float(sum(1 for s in entries if s.get("ready"))))
            ratio = _coverage_ratio(status)
            if ratio is not None:
                coverage.add_metric(values, ratio)
            certified = _conditions(status).get("Certified") or {}
            certification.add_metric([*values, str(certified.get("reason") or NO_CERTIFICATE)],
                                     1.0)
            for entry in entries:
                stage = [*values, str(entry.get("name"))]
                stage_ready.add_metric(stage, 1.0 if entry.get("ready") else 0.0)
                restarts.add_metric(stage, float(entry.get("restarts") or 0))
        yield from (epoch, stages, ready, coverage, certification, stage_ready, restarts,
                    replicas, replicas_ready)

    @staticmethod
    def _artifact_families(artifacts: Mapping[Key, Mapping[str, Any]]) -> Iterable[Any]:
        yield _condition_family("meshnet_artifact_condition",
                                "ModelArtifact conditions: 1 for the status that holds.",
                                "artifact", ARTIFACT_CONDITIONS, artifacts)
        labels = ["namespace", "artifact"]
        verified_bytes = GaugeMetricFamily("meshnet_artifact_verified_bytes",
                                           "Bytes hashed and matched.", labels=labels)
        size = GaugeMetricFamily("meshnet_artifact_size_bytes", "Bytes in the manifest.",
                                 labels=labels)
        verified_files = GaugeMetricFamily("meshnet_artifact_verified_files",
                                           "Files whose sha256 matched.", labels=labels)
        files = GaugeMetricFamily("meshnet_artifact_files", "Files in the manifest.",
                                  labels=labels)
        copies = GaugeMetricFamily("meshnet_artifact_node_copy_verified",
                                   "1 when the node's host-path copy is verified.",
                                   labels=[*labels, "node"])
        for (namespace, name), status in sorted(artifacts.items()):
            values = [namespace, name]
            progress = status.get("progress") or {}
            verified_bytes.add_metric(values, float(progress.get("bytesVerified") or 0))
            size.add_metric(values, float(progress.get("bytesTotal") or 0))
            verified_files.add_metric(values, float(progress.get("filesVerified") or 0))
            files.add_metric(values, float(progress.get("filesTotal") or 0))
            for copy in status.get("nodes") or []:
                copies.add_metric([*values, str(copy.get("node"))],
                                  1.0 if copy.get("verified") else 0.0)
        yield from (verified_bytes, size, verified_files, files, copies)
