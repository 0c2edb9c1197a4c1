"""`meshnet tracker`: the published report schema, report validation, and reporting the
routes of `meshnet up` to a Tracker."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

import click

from meshnet.api.tracker import Provider
from meshnet.cli.drift import report_drift
from meshnet.paths import repo_root
from meshnet.tracker import local
from meshnet.tracker.client import RetryPolicy, TrackerClient
from meshnet.tracker.metrics import TrackerMetrics
from meshnet.tracker.reporter import Reporting, step
from meshnet.tracker.schedule import Cadence
from meshnet.tracker.schema import SCHEMA_FILE, drift, render, report_schema
from meshnet.tracker.settings import pin_facts
from meshnet.tracker.validate import report_errors


@click.group("tracker")
def command() -> None:
    """Capacity reports for the Meshnet Tracker (meshnet.tracker/v1)."""


@command.command("schema")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the file drifted.")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Repository root (default: the current checkout).")
def schema_cmd(check: bool, root: Path | None) -> None:
    """Generate schemas/meshnet.tracker.v1.capacityreport.schema.json from the models."""
    root = root or repo_root()
    if check:
        problem = drift(root)
        report_drift([problem] if problem else [], "meshnet tracker schema",
                     "the report schema is up to date")
        return
    path = root / SCHEMA_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(report_schema()))
    click.echo(f"wrote {path}")


@command.command("validate")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
def validate_cmd(files: tuple[Path, ...]) -> None:
    """Check report JSON files against the published schema."""
    bad = 0
    for path in files:
        errors = report_errors(json.loads(path.read_text()))
        bad += bool(errors)
        for error in errors:
            click.echo(f"{path}: {error}", err=True)
    if bad:
        sys.exit(1)
    click.echo(f"{len(files)} report(s) valid")


@command.command("report")
@click.option("--route", "route_name", required=True, metavar="NAME",
              help="A route started by `meshnet up` on this machine.")
@click.option("--url", required=True, help="The Tracker's report endpoint.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File holding the bearer token (re-read for every report).")
@click.option("--provider", default="local", show_default=True, help="Provider id.")
@click.option("--cluster", default=None, help="Cluster id (default: this host's name).")
@click.option("--interval", type=click.FloatRange(0.1), default=5.0, show_default=True,
              help="Seconds between samples of the stages.")
@click.option("--every", type=click.FloatRange(0.1), default=30.0, show_default=True,
              help="Re-send an unchanged report at least this often (seconds).")
@click.option("--count", type=click.IntRange(1), default=None,
              help="Stop after this many samples (default: until interrupted).")
@click.option("--attempts", type=click.IntRange(1), default=4, show_default=True,
              help="POST attempts per report (jittered exponential backoff between).")
def report_cmd(route_name: str, url: str, token_file: Path | None, provider: str,
               cluster: str | None, interval: float, every: float, count: int | None,
               attempts: int) -> None:
    """Report a local route to a Tracker: on every change and at least every --every
    seconds. Not available (and says why) unless its lane has a passing certificate
    (`meshnet certify --route NAME`) and every stage is healthy."""
    asyncio.run(_report(route_name, url, token_file, Provider(
        id=provider, cluster=cluster or socket.gethostname()), interval, every, count,
        RetryPolicy(attempts=attempts)))


async def _report(name: str, url: str, token_file: Path | None, provider: Provider,
                  interval: float, every: float, count: int | None, policy: RetryPolicy) -> None:
    def token() -> str | None:
        return token_file.read_text().strip() if token_file else None

    client = TrackerClient(url, token, policy=policy)
    reporting = Reporting(provider, pin_facts(), client, TrackerMetrics())
    cadence = Cadence(every_seconds=every)
    samples = 0
    try:
        while count is None or samples < count:
            route = local.local_route(name)
            view, stages = local.views(route)
            stepped = await step(reporting, cadence, view, stages, local.certification(route))
            report, delivery = stepped.report, stepped.delivery
            samples += 1
            state = "available" if report.available else "NOT available: " + "; ".join(
                r.reason for r in report.unavailable_reasons)
            if delivery is not None:
                outcome = "sent" if delivery.ok else f"FAILED ({delivery.error})"
                click.echo(f"[tracker] report {cadence.sequence} {outcome}: {state}", err=True)
            if count is None or samples < count:
                await asyncio.sleep(interval)
    finally:
        await client.close()
