"""`meshnet monitoring dashboards`: write the chart's Grafana dashboards, or check them."""

from __future__ import annotations

from pathlib import Path

import click

from meshnet.cli.drift import report_drift
from meshnet.paths import repo_root


@click.group("monitoring")
def command() -> None:
    """Monitoring as code: the Grafana dashboards the chart ships."""


@command.command("dashboards")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the files drifted.")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Repository root (default: the current checkout).")
def dashboards(check: bool, root: Path | None) -> None:
    """Generate the chart's files/dashboards/*.json from meshnet.monitoring."""
    from meshnet.monitoring.generate import drift, write  # the SDK loads only when asked

    root = root or repo_root()
    if check:
        report_drift(drift(root), "meshnet monitoring dashboards", "dashboards are up to date")
        return
    for path in write(root):
        click.echo(f"wrote {path}")
