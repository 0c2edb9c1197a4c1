"""The gateway's load gauges as Prometheus sees them: running requests and KV use per
replica ({route or model_name, replica}: one family, one label set), the queue for the
whole route (admission is fleet-wide), and a replica that is gone loses its series."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meshnet.gateway.metrics import GatewayMetrics


def series(metrics: GatewayMetrics) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    text = generate_latest(metrics.registry).decode()
    found: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return found


def of(label: str, replica: str) -> frozenset[tuple[str, str]]:
    return frozenset({(label, "chat"), ("replica", replica)})


def test_running_and_kv_use_are_per_replica_and_the_queue_is_the_routes() -> None:
    metrics = GatewayMetrics("chat")
    metrics.running.show({"0": 3, "1": 1})
    metrics.kv_usage.show({"0": 0.5, "1": 0.25})
    metrics.waiting.set(2)
    metrics.model_server.waiting.set(2)

    found = series(metrics)

    for name, label in (("meshnet_num_requests_running", "route"),
                        ("vllm:num_requests_running", "model_name")):
        assert found[name] == {of(label, "0"): 3, of(label, "1"): 1}, name
    for name, label in (("meshnet_kv_cache_usage_perc", "route"),
                        ("vllm:kv_cache_usage_perc", "model_name"),
                        ("vllm:gpu_cache_usage_perc", "model_name")):
        assert found[name] == {of(label, "0"): 0.5, of(label, "1"): 0.25}, name
    assert found["vllm:num_requests_waiting"] == {frozenset({("model_name", "chat")}): 2}
    assert found["meshnet_num_requests_waiting"] == {frozenset({("route", "chat")}): 2}


def test_a_replica_scaled_away_or_not_measured_loses_its_series() -> None:
    metrics = GatewayMetrics("chat")
    metrics.running.show({"0": 1, "1": 2})
    metrics.kv_usage.show({"0": 0.5, "1": 0.5})
    metrics.running.show({"0": 1})
    metrics.kv_usage.show({})

    found = series(metrics)

    assert found["vllm:num_requests_running"] == {of("model_name", "0"): 1}
    assert "vllm:kv_cache_usage_perc" not in found and "meshnet_kv_cache_usage_perc" not in found
