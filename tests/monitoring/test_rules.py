"""The chart's PrometheusRule: valid for promtool, every alert unit-tested firing and not
firing, and every alert documented with a severity and a runbook section."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from meshnet.paths import repo_root

from .conftest import rule_groups, tool

UNIT_TESTS = Path(__file__).with_name("rules_test.yaml")
RUNBOOKS = repo_root() / "docs/runbooks.md"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_promtool_checks_the_rendered_rules(rules_file: Path) -> None:
    result = promtool("check", "rules", str(rules_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout


def test_promtool_unit_tests_of_every_alert_pass(rules_file: Path, tmp_path: Path) -> None:
    shutil.copy(rules_file, tmp_path / "rules.yaml")
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_cover_every_alert_both_firing_and_silent(rules_file: Path) -> None:
    alerts = {r["alert"] for g in yaml.safe_load(rules_file.read_text())["groups"]
              for r in g["rules"]}
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
             for case in test["alert_rule_test"]]
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    silent = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert firing == alerts and silent == alerts


def test_a_changed_threshold_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests pin the default thresholds: they would notice a rule that drifted."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(
        {"groups": rule_groups("monitoring.prometheusRule.thresholds.kvUsedRatio=0.97")}))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "alertname: MeshnetStageKVSaturated" in result.stdout + result.stderr


def test_every_alert_has_a_severity_summary_description_and_runbook_section(
        rules_file: Path) -> None:
    headings = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), re.M))
    for group in yaml.safe_load(rules_file.read_text())["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            assert rule["labels"]["severity"] in {"warning", "critical"}, name
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
            assert rule["annotations"]["runbook_url"] == f"docs/runbooks.md#{name.lower()}"
            assert name in headings, f"docs/runbooks.md has no section '## {name}'"
