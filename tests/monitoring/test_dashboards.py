"""The dashboards as code: the checked-in JSON is what meshnet.monitoring generates, and
the PromQL scanner behind the metric-name lint finds exactly the selectors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshnet.monitoring.generate import CHART_DASHBOARDS, boards, drift
from meshnet.monitoring.lint import exported_names, panel_queries, unexported
from meshnet.monitoring.promql import metric_names
from meshnet.paths import repo_root


def test_the_checked_in_dashboards_are_the_generated_ones() -> None:
    assert drift(repo_root()) == []


def test_a_hand_edited_dashboard_fails_the_check(tmp_path: Path) -> None:
    shutil.copytree(repo_root() / CHART_DASHBOARDS, tmp_path / CHART_DASHBOARDS)
    edited = tmp_path / CHART_DASHBOARDS / "meshnet-route.json"
    edited.write_text(edited.read_text().replace("Forward latency", "Latency"))
    result = subprocess.run([sys.executable, "-m", "meshnet.cli", "monitoring", "dashboards",
                             "--check", "--root", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "meshnet-route.json: differs from meshnet.monitoring" in result.stderr


def test_every_panel_reads_the_datasource_variable_and_has_its_own_id() -> None:
    for board in boards():
        model = json.loads(board.to_json())
        panels = model["panels"]
        assert len({p["id"] for p in panels}) == len(panels), board.uid
        for panel in panels:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                assert panel["targets"] and panel["description"], panel["title"]
        assert set(board.quiet) <= {p["title"] for p in panels}, board.uid


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (stage, le) (rate(meshnet_x_bucket{route=~"$route", a="b(c)"}[$__rate_interval]))',
     {"meshnet_x_bucket"}),
    ("histogram_quantile(0.99, sum by (kind, le) (rate(a_bucket[5m]))) > 1e-3", {"a_bucket"}),
    ('time() - max(b_seconds > 0) or on(job) up{job="x"} offset 5m', {"b_seconds", "up"}),
    ("absent(up == 1) and ignoring(instance) c / d", {"up", "c", "d"}),
])
def test_the_scanner_finds_the_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_lint_names_a_metric_nothing_exports() -> None:
    exposition = ("# HELP a_total A.\n# TYPE a_total counter\n"
                  "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\n")
    exported = exported_names(exposition)
    assert {"a_total", "h_bucket", "h_sum", "h_count"} <= exported
    problems = unexported([("panel X", "rate(a_total[1m]) + rate(h_sum[1m]) + b_gauge")],
                          exported)
    assert problems == ["panel X reads b_gauge"]


def test_panel_queries_walks_every_target() -> None:
    route = json.loads(next(b for b in boards() if b.uid == "meshnet-route").to_json())
    titles = {title for title, _ in panel_queries(route)}
    assert {"Forward latency", "KV tokens", "Hop to the next stage", "Recoveries"} <= titles
