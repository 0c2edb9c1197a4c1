"""The one JSON summary of bench/gpu_lane.sh: what it wrote under OUT, per lane.

    python bench/gpu_lane_summary.py OUT LANE [LANE ...]

Per lane: the build's seconds, test-deepseek4-steps' status, every gpu_lane test case's
outcome (a skip or failure with its reason), what each stage's start-up probe measured
(exact_step_rows, exact_batching, from the workers' logs), and the figures of
bench/lane_exactness.py and bench/route_bench.py where they ran. Exit status 1 when
anything failed or a lane left no test report."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

PROBE = re.compile(r"exactness: exact_step_rows (\d+), exact_batching (true|false)")


def read(path: Path) -> str | None:
    return path.read_text().strip() if path.is_file() else None


def test_cases(report: Path) -> dict[str, str]:
    """pytest's junit XML -> {test id: "passed" | "failed: ..." | "skipped: reason"}."""
    cases: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                label = "skipped" if kind == "skipped" else "failed"
                outcome = f"{label}: {(found.get('message') or '').strip()[:300]}"
        cases[name] = outcome
    return cases


def probes(folder: Path) -> list[dict[str, Any]]:
    """Every stage's probe line in the tests' worker logs, with the log it came from."""
    found = []
    for log in sorted(folder.rglob("*.log")) if folder.is_dir() else []:
        for line in log.read_text(errors="replace").splitlines():
            if match := PROBE.search(line):
                found.append({"log": str(log.relative_to(folder)),
                              "exact_step_rows": int(match.group(1)),
                              "exact_batching": match.group(2) == "true"})
    return found


def lane_summary(out: Path, lane: str) -> dict[str, Any]:
    steps_rc = read(out / f"steps-{lane}.rc")
    steps_log = read(out / f"steps-{lane}.log") or ""
    summary: dict[str, Any] = {
        "device": read(out / f"device-{lane}.txt"),
        "build_seconds": int(read(out / f"build-{lane}.seconds") or -1),
        "deepseek4_steps": {"passed": steps_rc == "0", "exit": steps_rc,
                            "last_lines": steps_log.splitlines()[-3:]},
    }
    report = out / f"tests-{lane}.xml"
    cases = test_cases(report) if report.is_file() else {}
    counts = {kind: sum(v.startswith(kind) for v in cases.values())
              for kind in ("passed", "failed", "skipped")}
    summary["tests"] = {**counts, "cases": cases}
    summary["probes"] = probes(out / f"pytest-{lane}")
    for name in ("exactness", "route"):
        figures = out / f"{name}-{lane}.json"
        summary[name] = json.loads(figures.read_text()) if figures.is_file() else None
    summary["ok"] = bool(cases) and counts["failed"] == 0 and steps_rc == "0"
    return summary


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    lanes = {lane: lane_summary(out, lane) for lane in argv[1:]}
    print(json.dumps({"lanes": lanes,
                      "ok": all(lane["ok"] for lane in lanes.values())}, indent=2))
    return 0 if all(lane["ok"] for lane in lanes.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
