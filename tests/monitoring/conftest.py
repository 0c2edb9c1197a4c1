"""The chart's alerts and dashboards as shipped: rules rendered by the real helm, and the
promtool/prometheus binaries of Debian's `prometheus` package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshnet.devtools.kube_tools import install
from meshnet.paths import repo_root

CHART = repo_root() / "charts/meshnet-shard-operator"
PROMETHEUS_OPERATOR = ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"]


def tool(name: str) -> str:
    """A binary of the `prometheus` Debian package (scripts/install-system-deps.sh)."""
    found = shutil.which(name)
    assert found, f"{name} is missing: run `make deps` (Debian package prometheus)"
    return found


def rule_groups(*values: str) -> list[dict[str, Any]]:
    """spec.groups of the chart's PrometheusRule, rendered with `--set-json` VALUES."""
    args = [str(install()["helm"]), "template", "meshnet", str(CHART), *PROMETHEUS_OPERATOR,
            "--set", "monitoring.prometheusRule.enabled=true",
            "--set", "metrics.serviceMonitor.enabled=true"]
    for value in values:
        args += ["--set-json", value]  # JSON: a number stays a number for the schema
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (rule,) = [d for d in yaml.safe_load_all(result.stdout)
               if d and d["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


@pytest.fixture(scope="session")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default rules as a Prometheus rule file."""
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    return path
