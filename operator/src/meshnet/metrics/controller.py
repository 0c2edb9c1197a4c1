"""The operator's Prometheus metrics, in a registry of their own (tests start fresh)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from meshnet.metrics.resource_status import StatusCollector


class OperatorMetrics:
    """Reconciles, errors and durations by kind; routes by condition; epoch advances;
    and, through `status`, each route's and artifact's derived status as gauges; plus the
    process's own CPU and memory (process_*), which tell a busy operator from a slow API."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.reconciles = Counter("meshnet_reconciles_total", "Reconciles run.", ["kind"],
                                  registry=self.registry)
        self.triggers = Counter("meshnet_reconcile_triggers_total",
                                "ShardRoute handler calls by trigger (create, update, resume,"
                                " delete, timer, pod, artifact) and those skipped as showing"
                                " nothing new (pod-unchanged, pod-deleted-early,"
                                " artifact-unchanged).", ["trigger"], registry=self.registry)
        self.errors = Counter("meshnet_reconcile_errors_total", "Reconciles that failed.",
                              ["kind"], registry=self.registry)
        self.duration = Histogram("meshnet_reconcile_duration_seconds", "Reconcile time.",
                                  ["kind"], registry=self.registry)
        self.routes = Gauge("meshnet_routes", "ShardRoutes whose condition has this status.",
                            ["condition", "status"], registry=self.registry)
        self.epoch_advances = Counter("meshnet_epoch_advances_total",
                                      "Times a ShardRoute's epoch advanced.",
                                      registry=self.registry)
        self.status = StatusCollector()
        self.registry.register(self.status)
        self._conditions: dict[tuple[str, str], Mapping[str, str]] = {}
        for kind in ("Ready", "Progressing", "Degraded"):
            for status in ("True", "False", "Unknown"):
                self.routes.labels(kind, status).set(0)

    def route_conditions(self, key: tuple[str, str], conditions: Mapping[str, str] | None) -> None:
        """Record one route's condition statuses (None: route gone) in the gauge."""
        for kind, status in self._conditions.pop(key, {}).items():
            self.routes.labels(kind, status).dec()
        if conditions is not None:
            self._conditions[key] = dict(conditions)
            for kind, status in conditions.items():
                self.routes.labels(kind, status).inc()
