"""Monitoring as code: the Grafana dashboards the chart ships, built from Python.

    board       a dashboard under construction: rows, panels, template variables
    fleet       Fleet overview: routes, epochs, stages, certification, Tracker, operator
    route       Route detail: per-stage latency, throughput, capacity, seams, reliability
    artifacts   Artifacts: provisioning progress, per-node copies, failures
    generate    every dashboard as JSON in the chart, and the drift check
    promql      the metric names a PromQL expression reads (for the metric-name lint)

The alerts are the chart's `templates/prometheusrule.yaml` (thresholds are chart values)
with their runbooks in `docs/runbooks.md`.
"""
