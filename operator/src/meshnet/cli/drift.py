"""`--check` of the commands that generate committed files: report drift and exit 1."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click


def report_drift(problems: Sequence[str], regenerate: str, up_to_date: str) -> None:
    """Print each problem and exit 1 naming `regenerate`; else say `up_to_date`."""
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        click.echo(f"run `{regenerate}` to regenerate", err=True)
        sys.exit(1)
    click.echo(up_to_date)
