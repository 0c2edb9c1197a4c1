"""The gateway's Prometheus metrics, named as vLLM and the serving ecosystem name them, under
meshnet_. Labels stay bounded: the route, an outcome from a fixed set, and the replica (as
many as spec.replicas)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from meshnet.route.exactness import LIMITS

# Fixed outcomes of a request (meshnet_requests_total{status}).
OUTCOMES = ("ok", "bad_request", "unauthorized", "rejected", "unavailable", "cancelled", "error")

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
            10.0, 20.0, 40.0, 80.0)
_TOKEN_GAP = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2,
              0.5, 1.0, 2.5)


class GatewayMetrics:
    def __init__(self, route: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["route"]
        self.ttft = Histogram(
            "meshnet_time_to_first_token_seconds",
            "From the request's arrival to its first generated token.",
            labels, buckets=_LATENCY, registry=self.registry).labels(route)
        self.itl = Histogram(
            "meshnet_inter_token_latency_seconds",
            "Between two consecutive generated tokens of one request.",
            labels, buckets=_TOKEN_GAP, registry=self.registry).labels(route)
        self.e2e = Histogram(
            "meshnet_e2e_request_latency_seconds",
            "From the request's arrival to its last byte, queueing included.",
            labels, buckets=_LATENCY, registry=self.registry).labels(route)
        self.queue_time = Histogram(
            "meshnet_request_queue_time_seconds",
            "Time a request waited for a session slot.",
            labels, buckets=_LATENCY, registry=self.registry).labels(route)
        self.prompt_tokens = Counter(
            "meshnet_prompt_tokens", "Prompt tokens prefilled.", labels,
            registry=self.registry).labels(route)
        self.generation_tokens = Counter(
            "meshnet_generation_tokens", "Tokens generated.", labels,
            registry=self.registry).labels(route)
        # speculative decoding, as vLLM names it (spec_decode_num_*_tokens)
        self.draft_tokens = Counter(
            "meshnet_spec_decode_num_draft_tokens", "Speculative draft tokens verified.",
            labels, registry=self.registry).labels(route)
        self.accepted_tokens = Counter(
            "meshnet_spec_decode_num_accepted_tokens",
            "Speculative draft tokens accepted (each one a decode step saved).",
            labels, registry=self.registry).labels(route)
        # requests that speculated less than asked, by why (meshnet.route.exactness), and
        # requests whose tokens may depend on the load (a stage batches for throughput)
        limited = Counter(
            "meshnet_speculation_limited",
            "Requests that speculated less than asked, or decoded plainly, because a stage"
            " cannot discard (no_discard) or computes a verify window that wide inexactly"
            " (not_exact).", ["route", "reason"], registry=self.registry)
        self.speculation_limited = {reason: limited.labels(route, reason) for reason in LIMITS}
        self.load_dependent = Counter(
            "meshnet_load_dependent_requests",
            "Requests served by a route whose stages batch for throughput (--batching"
            " throughput): their tokens may depend on the load.", labels,
            registry=self.registry).labels(route)
        self.waiting = Gauge(
            "meshnet_num_requests_waiting", "Requests queued for a session slot.", labels,
            registry=self.registry).labels(route)
        requests = Counter(
            "meshnet_requests", "Requests by outcome.", ["route", "status"],
            registry=self.registry)
        self.outcomes = {outcome: requests.labels(route, outcome) for outcome in OUTCOMES}
        self.model_server = ModelServerGauges(route, self.registry)
        # Per replica (a Prometheus family has one label set): a route-wide figure is
        # sum (running) or max (KV use) by route in the query.
        self.running = PerReplica(route, [Gauge(
            "meshnet_num_requests_running", "Requests holding a session slot on the replica.",
            [*labels, "replica"], registry=self.registry), self.model_server.running])
        self.kv_usage = PerReplica(route, [Gauge(
            "meshnet_kv_cache_usage_perc",
            "Share of the replica's KV cells in use, 0..1 (its fullest stage's), as of the"
            " last probe.", [*labels, "replica"], registry=self.registry),
            *self.model_server.kv_usage])
        self.route_ready = Gauge(
            "meshnet_gateway_route_ready",
            "1 while the route is servable: every stage of a replica answered the handshake.",
            labels, registry=self.registry).labels(route)
        self.replicas = ReplicaMetrics(route, self.registry)


class ReplicaMetrics:
    """Per replica of the route: ready, sessions running, sessions taken (started there or
    moved there from a replica that died), and the route's moves."""

    def __init__(self, route: str, registry: CollectorRegistry) -> None:
        self.route = route
        labels = ["route", "replica"]
        self.ready = Gauge("meshnet_replica_ready",
                           "1 while every stage of the replica answered the last handshake.",
                           labels, registry=registry)
        self.running = Gauge("meshnet_replica_requests_running",
                             "Sessions running on the replica.", labels, registry=registry)
        self.taken = Counter("meshnet_replica_sessions",
                             "Sessions the replica took: admitted to it, or moved to it.",
                             labels, registry=registry)
        self.moves = Counter("meshnet_session_moves",
                             "Sessions finished on another replica than they ran on (theirs "
                             "died or lost their state).", ["route"],
                             registry=registry).labels(route)
        self._shown: set[str] = set()

    def sessions(self, replica: str) -> None:
        self.taken.labels(self.route, replica).inc()

    def moved(self, replica: str) -> None:
        self.sessions(replica)
        self.moves.inc()

    def show(self, replicas: Sequence[tuple[str, bool, int]]) -> None:
        """Sets the gauges of the replicas there are (name, ready, running); a replica
        scaled away loses its series."""
        names = {name for name, _, _ in replicas}
        for name in self._shown - names:
            for metric in (self.ready, self.running, self.taken):
                with contextlib.suppress(KeyError):  # a series never set
                    metric.remove(self.route, name)
        for name, ready, running in replicas:
            self.ready.labels(self.route, name).set(1 if ready else 0)
            self.running.labels(self.route, name).set(running)
        self._shown = names


class PerReplica:
    """Gauge families labelled (route or model name, replica), set together: a replica
    that is gone (scaled away, or not measured this time) loses its series."""

    def __init__(self, route: str, families: Sequence[Gauge]) -> None:
        self.route, self.families = route, list(families)
        self._shown: set[str] = set()

    def show(self, values: Mapping[str, float]) -> None:
        for name in self._shown - set(values):
            for family in self.families:
                with contextlib.suppress(KeyError):
                    family.remove(self.route, name)
        for name, value in values.items():
            for family in self.families:
                family.labels(self.route, name).set(value)
        self._shown = set(values)


class ModelServerGauges:
    """The gauges the Gateway API Inference Extension's endpoint picker and the autoscalers
    built for vLLM read, under vLLM's names (its model server protocol: queued and running
    requests, KV-cache utilisation, the cache's block size), so they work unchanged on a
    meshnet route. The same values as meshnet_num_requests_*/meshnet_kv_cache_usage_perc:
    running requests and KV use per replica ({model_name, replica}, as vLLM exports them per
    server), the queue for the whole route ({model_name}: admission is fleet-wide)."""

    # One KV cell per token: the route's caches are not paged in blocks.
    BLOCK_SIZE = 1

    def __init__(self, route: str, registry: CollectorRegistry) -> None:
        labels = ["model_name"]
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests queued for a session slot.",
                             labels, registry=registry).labels(route)
        self.running = Gauge("vllm:num_requests_running",
                             "Requests holding a session slot on the replica.",
                             [*labels, "replica"], registry=registry)
        usage = "The replica's KV-cache usage, 0..1 (1 means 100%)."
        self.kv_usage = [Gauge(name, usage, [*labels, "replica"], registry=registry)
                         for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")]
        Gauge("vllm:cache_config_info", "The KV cache's configuration, in its labels.",
              ["model_name", "block_size"], registry=registry,
              ).labels(route, str(self.BLOCK_SIZE)).set(1)
