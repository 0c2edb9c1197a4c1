"""Route detail: one route's stages side by side, from the route's state down to each
seam. Stage metrics carry namespace/route/stage from the scrape (pod labels)."""

from __future__ import annotations

from meshnet.monitoring.board import RATE, Board, Query

ROUTE = 'namespace=~"$namespace", route=~"$route"'
STAGE = f'{ROUTE}, stage=~"$stage"'
BY = "sum by (stage)"


def _rate(metric: str, matchers: str = "") -> str:
    return f"{BY} (rate({metric}{{{STAGE}{matchers}}}[{RATE}]))"


def _quantile(q: float, metric: str) -> str:
    return f"histogram_quantile({q}, sum by (stage, le) (rate({metric}_bucket{{{STAGE}}}[{RATE}])))"


def _gateway_quantile(q: float, metric: str) -> str:
    return (f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{ROUTE}}}"
            f"[{RATE}])))")


def route() -> Board:
    board = Board(
        "meshnet-route", "Meshnet / Route detail",
        "One route: its gateway's requests (TTFT, inter-token latency, outcomes), then its "
        "stages' latency, throughput, busy share, queue, sessions and KV, boundary bytes and "
        "hops per seam, recoveries, restarts, incarnation age.",
        variables=(
            ("namespace", "label_values(meshnet_route_epoch, namespace)"),
            ("route", 'label_values(meshnet_route_epoch{namespace=~"$namespace"}, route)'),
            ("stage", "label_values(meshnet_shard_tokens_processed_total"
                      '{namespace=~"$namespace", route=~"$route"}, stage)'),
        ))
    (board.row("Route")
     .single("Ready", "1 when the route's Ready condition is True.", "short",
             Query(f'max(meshnet_route_condition{{{ROUTE}, condition="Ready", status="True"}})'))
     .single("Epoch", "The route's epoch, and the epoch each stage's worker serves (they "
             "differ only during a rollout).", "short",
             Query(f"max(meshnet_route_epoch{{{ROUTE}}})", "route"),
             Query(f"{BY.replace('sum', 'max')} (meshnet_shard_epoch{{{STAGE}}})", "{{stage}}"))
     .single("Stages ready", "Stages ready at the current epoch, of the route's stages.",
             "short",
             Query(f"sum(meshnet_route_stages_ready{{{ROUTE}}})", "ready"),
             Query(f"sum(meshnet_route_stages{{{ROUTE}}})", "total"))
     .single("Replicas ready", "Replicas (pipelines) whose every stage is ready, of the "
             "replicas the route asks for (spec.replicas).", "short",
             Query(f"sum(meshnet_route_replicas_ready{{{ROUTE}}})", "ready"),
             Query(f"sum(meshnet_route_replicas{{{ROUTE}}})", "asked"))
     .single("Certification", "The Certified condition's reason.", "short",
             Query(f"max by (state) (meshnet_route_certification{{{ROUTE}}})", "{{state}}")))
    (board.row("Requests (gateway)")
     .graph("Time to first token", "From a request's arrival at the gateway to its first "
            "token, queueing included (p50, p99).", "s",
            Query(_gateway_quantile(0.5, "meshnet_time_to_first_token_seconds"), "p50"),
            Query(_gateway_quantile(0.99, "meshnet_time_to_first_token_seconds"), "p99"))
     .graph("Inter-token latency", "Between two tokens of one request (p50, p99).", "s",
            Query(_gateway_quantile(0.5, "meshnet_inter_token_latency_seconds"), "p50"),
            Query(_gateway_quantile(0.99, "meshnet_inter_token_latency_seconds"), "p99"))
     .graph("Requests", "Requests holding a session slot and waiting for one.", "short",
            Query(f"sum(meshnet_num_requests_running{{{ROUTE}}})", "running"),
            Query(f"sum(meshnet_num_requests_waiting{{{ROUTE}}})", "waiting"))
     .graph("Outcomes", "Requests by outcome: ok, bad_request, rejected (429), "
            "unavailable (503), cancelled, error.", "reqps",
            Query(f"sum by (status) (rate(meshnet_requests_total{{{ROUTE}}}[{RATE}]))",
                  "{{status}}")))
    (board.row("Stage compute")
     .graph("Forward latency", "p50 and p99 from a step's arrival to its answer, per stage.",
            "s",
            Query(_quantile(0.5, "meshnet_shard_forward_latency_seconds"), "p50 {{stage}}"),
            Query(_quantile(0.99, "meshnet_shard_forward_latency_seconds"), "p99 {{stage}}"))
     .graph("Tokens/s", "Token positions each stage ran (prefill and decode).", "short",
            Query(_rate("meshnet_shard_tokens_processed_total"), "{{stage}}"))
     .graph("Busy share", "Share of wall time the stage's engine spent in steps.",
            "percentunit",
            Query(_rate("meshnet_shard_engine_busy_seconds_total"), "{{stage}}"))
     .graph("Queue depth", "Steps waiting for the stage's engine.", "short",
            Query(f"{BY} (meshnet_shard_queue_depth{{{STAGE}}})", "{{stage}}")))
    (board.row("Sessions and KV")
     .graph("Session slots", "Slots holding a session, and all slots, per stage.", "short",
            Query(f"{BY} (meshnet_shard_active_sessions{{{STAGE}}})", "used {{stage}}"),
            Query(f"{BY} (meshnet_shard_session_slots{{{STAGE}}})", "total {{stage}}"))
     .graph("KV tokens", "KV cells in use and free, all slots, per stage.", "short",
            Query(f"{BY} (meshnet_shard_kv_tokens_used{{{STAGE}}})", "used {{stage}}"),
            Query(f"{BY} (meshnet_shard_kv_tokens_capacity{{{STAGE}}} - "
                  f"meshnet_shard_kv_tokens_used{{{STAGE}}})", "free {{stage}}")))
    (board.row("Prefix cache")
     .graph("Prefix hit ratio", "New sessions that started from a cached prefix, of those "
            "that asked to, per stage (a miss falls back to a shorter prefix or a cold "
            "prefill; it answers CACHE_MISS with prefix_held).", "percentunit",
            Query(_rate("meshnet_shard_prefix_hits_total") + " / "
                  + _rate("meshnet_shard_prefix_lookups_total"), "{{stage}}"),
            quiet="only stages started with --prefix-cache-entries look prefixes up")
     .graph("Reused tokens/s", "Prompt positions copied from a cached prefix instead of "
            "computed, per stage.", "short",
            Query(_rate("meshnet_shard_prefix_reused_tokens_total"), "{{stage}}"))
     .graph("Prefix cache entries", "Released sessions' slots kept as entries, and the KV "
            "bytes of the positions they hold, per stage.", "short",
            Query(f"{BY} (meshnet_shard_prefix_cache_entries{{{STAGE}}})", "entries {{stage}}"),
            Query(f"{BY} (meshnet_shard_prefix_cache_bytes{{{STAGE}}})", "bytes {{stage}}")))
    (board.row("Seams")
     .graph("Boundary bytes per token", "Bytes each stage sends to the next per token "
            "position: the seam's cost, set by the boundary dtype and width.", "bytes",
            Query(_rate("meshnet_shard_boundary_bytes_total", ', direction="out"') + " / "
                  + _rate("meshnet_shard_tokens_processed_total"), "{{stage}} -> next"))
     .graph("Hop to the next stage", "What the seam after a chain stage adds to a step: "
            "the round trip less the next stage's own time (p50, p99).", "s",
            Query(_quantile(0.5, "meshnet_shard_next_hop_seconds"), "p50 {{stage}} -> next"),
            Query(_quantile(0.99, "meshnet_shard_next_hop_seconds"), "p99 {{stage}} -> next"),
            quiet="only chain stages (--next-stage) relay, and so time the hop behind them")
     .graph("Relay batches", "Batches of steps a chain stage took from the previous one, "
            "by transport (local: the loopback relay; grpc).", "ops",
            Query(f"sum by (stage, transport) (rate(meshnet_shard_relay_batches_total"
                  f"{{{STAGE}}}[{RATE}]))", "{{stage}} {{transport}}"),
            width=24))
    (board.row("Reliability")
     .graph("Recoveries", "Answers that make the route driver re-prefill (CACHE_MISS, "
            "EPOCH_MISMATCH), by the stage that answered.", "ops",
            Query(f"sum by (stage, reason) (rate(meshnet_shard_errors_total{{{STAGE}, "
                  f'reason=~"CACHE_MISS|EPOCH_MISMATCH"}}[{RATE}]))', "{{stage}} {{reason}}"))
     .graph("Errors by reason", "Every refused or failed RPC, by ErrorInfo reason.", "ops",
            Query(f"sum by (stage, reason) (rate(meshnet_shard_errors_total{{{STAGE}}}"
                  f"[{RATE}]))", "{{stage}} {{reason}}"))
     .graph("Restarts", "Restarts of each stage's current worker pod.", "short",
            Query(f"max by (stage) (meshnet_stage_restarts_total{{{STAGE}}})", "{{stage}}"),
            width=8)
     .graph("Incarnation age", "Time since each stage's worker started; a restart begins a "
            "new incarnation, and its sessions' KV is gone.", "s",
            Query(f"max by (stage) (time() - meshnet_shard_start_time_seconds{{{STAGE}}})",
                  "{{stage}}"),
            width=8)
     .graph("Stage scraped", "1 while Prometheus reaches the stage's metrics port.", "short",
            Query(f'max by (stage) (up{{job="meshnet-stage", {STAGE}}})', "{{stage}}"),
            width=8))
    return board
