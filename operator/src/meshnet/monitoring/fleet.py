"""Fleet overview: every route at a glance, then Tracker delivery and the operator itself."""

from __future__ import annotations

from meshnet.monitoring.board import RATE, Board, Query

NS = 'namespace=~"$namespace"'
NO_TRACKER = "the operator reports to a Tracker only when MESHNET_TRACKER_URL is set"


def fleet() -> Board:
    board = Board("meshnet-fleet", "Meshnet / Fleet overview",
                  "Routes, epochs, stages, coverage and certification; Tracker report "
                  "delivery; operator reconciles.",
                  variables=(("namespace", "label_values(meshnet_route_epoch, namespace)"),))
    (board.row("Routes")
     .single("Routes Ready", "Routes whose Ready condition is True.", "short",
             Query(f'sum(meshnet_route_condition{{{NS}, condition="Ready", status="True"}})'))
     .single("Routes not Ready", "Routes whose Ready condition is False or Unknown.", "short",
             Query(f'sum(meshnet_route_condition{{{NS}, condition="Ready", status!="True"}})'))
     .single("Stages ready", "Stage pods of the current epochs that are ready, of all.",
             "short",
             Query(f"sum(meshnet_route_stages_ready{{{NS}}})", "ready"),
             Query(f"sum(meshnet_route_stages{{{NS}}})", "total"))
     .single("Epoch advances (1h)", "Times a route's epoch advanced: each is a re-split, a "
             "new recipe or artifact, and a re-prefill of every session.", "short",
             Query("sum(increase(meshnet_epoch_advances_total[1h]))"))
     .graph("Routes by condition", "How many routes hold each condition (True).", "short",
            Query(f'sum by (condition) (meshnet_route_condition{{{NS}, status="True"}})',
                  "{{condition}}"))
     .graph("Epoch by route", "status.epoch of each route.", "short",
            Query(f"max by (namespace, route) (meshnet_route_epoch{{{NS}}})",
                  "{{namespace}}/{{route}}"))
     .graph("Stages ready / total by route", "A route is Ready when every stage is.", "short",
            Query(f"sum by (namespace, route) (meshnet_route_stages_ready{{{NS}}})",
                  "{{namespace}}/{{route}} ready"),
            Query(f"sum by (namespace, route) (meshnet_route_stages{{{NS}}})",
                  "{{namespace}}/{{route}} total"))
     .graph("Replicas ready / asked by route", "Replicas (pipelines) whose every stage is "
            "ready, and spec.replicas: a route serves with fewer when they differ.", "short",
            Query(f"sum by (namespace, route) (meshnet_route_replicas_ready{{{NS}}})",
                  "{{namespace}}/{{route}} ready"),
            Query(f"sum by (namespace, route) (meshnet_route_replicas{{{NS}}})",
                  "{{namespace}}/{{route}} asked"))
     .graph("Coverage", "Layers the stages cover, as a share of the model's block count.",
            "percentunit",
            Query(f"max by (namespace, route) (meshnet_route_coverage_ratio{{{NS}}})",
                  "{{namespace}}/{{route}}"))
     .graph("Certification state", "Routes by the reason of their Certified condition "
            "(None: not yet written). Only LaneCertified routes are advertised.", "short",
            Query(f"sum by (state) (meshnet_route_certification{{{NS}}})", "{{state}}"),
            width=24))
    (board.row("Tracker reports")
     .graph("Reports sent / failed", "Reports the Tracker accepted, and those given up on "
            "after the bounded retries, by reason.", "reqps",
            Query(f"sum(rate(meshnet_tracker_reports_sent_total[{RATE}]))", "sent"),
            Query(f"sum by (reason) (rate(meshnet_tracker_reports_failed_total[{RATE}]))",
                  "failed {{reason}}"),
            quiet=NO_TRACKER)
     .graph("Retries and stage sampling errors", "POSTs repeated after a failure; GetInfo/"
            "GetCapacity calls to stages that failed or timed out.", "reqps",
            Query(f"sum(rate(meshnet_tracker_report_retries_total[{RATE}]))", "retries"),
            Query(f"sum(rate(meshnet_tracker_stage_collect_errors_total[{RATE}]))",
                  "stage sampling errors"),
            quiet=NO_TRACKER)
     .single("Since the last accepted report", "Seconds since the Tracker last accepted a "
             "report.", "s",
             Query("time() - max(meshnet_tracker_last_success_timestamp_seconds > 0)"),
             quiet=NO_TRACKER)
     .single("Routes available", "Routes whose latest report says available.", "short",
             Query("sum(meshnet_tracker_routes_available)"), quiet=NO_TRACKER)
     .graph("Certifications", "Certificates recorded, by result.", "short",
            Query(f"sum by (result) (increase(meshnet_certifications_total[{RATE}]))",
                  "{{result}}"),
            quiet="no certification ran"))
    (board.row("Operator")
     .single("Operator up", "1 while Prometheus scrapes the operator.", "short",
             Query('max(up{job="meshnet-operator"})'))
     .graph("Reconciles", "Reconciles run per second, by kind.", "ops",
            Query(f"sum by (kind) (rate(meshnet_reconciles_total[{RATE}]))", "{{kind}}"),
            width=9)
     .graph("Reconcile errors", "Reconciles that failed (API errors; retried), by kind.",
            "ops",
            Query(f"sum by (kind) (rate(meshnet_reconcile_errors_total[{RATE}]))", "{{kind}}"),
            width=9, quiet="no reconcile failed")
     .graph("Reconcile latency", "p50 and p99 of one reconcile, by kind.", "s",
            Query("histogram_quantile(0.5, sum by (kind, le) "
                  f"(rate(meshnet_reconcile_duration_seconds_bucket[{RATE}])))", "p50 {{kind}}"),
            Query("histogram_quantile(0.99, sum by (kind, le) "
                  f"(rate(meshnet_reconcile_duration_seconds_bucket[{RATE}])))", "p99 {{kind}}"),
            width=24))
    return board
