"""Prometheus metrics of Tracker reporting and certification, registered beside the
operator's own (or in a registry of their own for `meshnet tracker report`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class TrackerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.sent = Counter("meshnet_tracker_reports_sent_total",
                            "Reports the Tracker accepted.", registry=self.registry)
        self.failed = Counter("meshnet_tracker_reports_failed_total",
                              "Reports given up on after the bounded retries.", ["reason"],
                              registry=self.registry)
        self.retries = Counter("meshnet_tracker_report_retries_total",
                               "Attempts repeated after a failed POST.", registry=self.registry)
        self.last_success = Gauge("meshnet_tracker_last_success_timestamp_seconds",
                                  "Unix time of the last report the Tracker accepted.",
                                  registry=self.registry)
        self.available = Gauge("meshnet_tracker_routes_available",
                               "Routes whose latest report says available.",
                               registry=self.registry)
        self.collect_errors = Counter("meshnet_tracker_stage_collect_errors_total",
                                      "GetInfo/GetCapacity calls that failed or timed out.",
                                      registry=self.registry)
        self.certifications = Counter("meshnet_certifications_total",
                                      "Certificates recorded, by result.", ["result"],
                                      registry=self.registry)
        self._available: set[tuple[str, str]] = set()

    def route_available(self, key: tuple[str, str], available: bool | None) -> None:
        """Record one route's availability (None: gone) and refresh the gauge."""
        if available:
            self._available.add(key)
        else:
            self._available.discard(key)
        self.available.set(len(self._available))
