"""The published schema is the models' (drift fails), and reports go out on every change
and at least every N seconds, never more often for an unchanged route."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from meshnet.api.tracker import CapacityReport, Provider
from meshnet.certify import lane as lanes
from meshnet.paths import repo_root
from meshnet.tracker.inputs import PinFacts
from meshnet.tracker.report import build_report
from meshnet.tracker.schedule import Cadence, fingerprint
from meshnet.tracker.schema import SCHEMA_FILE, drift, render, report_schema

from .conftest import certificate, lane, route_view, samples, stage_views


def test_the_checked_in_schema_is_what_the_models_generate() -> None:
    assert drift(repo_root()) is None
    schema = json.loads((repo_root() / SCHEMA_FILE).read_text())
    assert schema["$id"].endswith("/tracker/v1/capacityreport.json")
    assert schema["properties"]["apiVersion"]["const"] == "meshnet.tracker/v1"


def test_schema_check_fails_on_a_stale_file_and_names_it(tmp_path: Path) -> None:
    stale = tmp_path / SCHEMA_FILE
    stale.parent.mkdir(parents=True)
    stale.write_text(render(report_schema()).replace("Report version.", "old words"))

    result = subprocess.run([sys.executable, "-m", "meshnet.cli", "tracker", "schema", "--check",
                             "--root", str(tmp_path)], capture_output=True, text=True, timeout=60)

    assert result.returncode == 1
    assert "differs from meshnet.api.tracker" in result.stderr


def built(slots_free: int = 4, tokens_per_second: float = 0.0, now: float = 2_000.0,
          sequence: int = 1) -> CapacityReport:
    answers = {name: replace(sample, capacity=replace(
        sample.capacity, recent_tokens_per_second=tokens_per_second) if sample.capacity else None)
        for name, sample in samples(slots_free=slots_free).items()}
    return build_report(route_view(), stage_views(), answers,
                        lanes.state(lane(), certificate()),
                        provider=Provider(id="p", cluster="c"), pin=PinFacts(),
                        sequence=sequence, now=now, first_seen={})


def test_clock_and_load_figures_do_not_count_as_a_change() -> None:
    first = built(tokens_per_second=0.0, now=2_000.0, sequence=1)
    later = built(tokens_per_second=55.0, now=2_030.0, sequence=2)

    assert fingerprint(first) == fingerprint(later)
    assert fingerprint(built(slots_free=2)) != fingerprint(first)


def test_a_changed_report_is_due_at_once_and_an_unchanged_one_after_the_interval() -> None:
    cadence = Cadence(every_seconds=30.0)
    quiet, busy = fingerprint(built()), fingerprint(built(slots_free=2))

    assert cadence.due(quiet, now=100.0)  # nothing delivered yet
    cadence.delivered(quiet, now=100.0)
    assert not cadence.due(quiet, now=129.9)
    assert cadence.due(busy, now=101.0)
    assert cadence.due(quiet, now=130.0)


def test_a_failed_delivery_keeps_the_report_due() -> None:
    cadence = Cadence(every_seconds=30.0)
    print_ = fingerprint(built())

    assert cadence.due(print_, now=100.0)
    assert cadence.due(print_, now=101.0)  # nothing was delivered: try again next pass
