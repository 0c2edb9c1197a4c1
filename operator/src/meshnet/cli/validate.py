"""`meshnet validate`: check ModelArtifact and ShardRoute manifests offline."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from meshnet.api.validate import load, validate, warnings


@click.command("validate")
@click.option(
    "-f", "--filename", "files", multiple=True, required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Manifest file (YAML, may hold several documents); repeat for more.",
)
@click.argument("more", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def command(files: tuple[Path, ...], more: tuple[Path, ...]) -> None:
    """Validate manifests with the CRDs' schema and CEL rules and the operator's checks.

    A ShardRoute is also checked against a ModelArtifact of the same name and namespace
    in the given files (stage ranges within its block count). Exits 1 when anything is
    invalid; documents of other kinds are listed as skipped.
    """
    docs = load([*files, *more])
    results = validate(docs)
    for doc in docs:
        problems = results.get(doc)
        if problems is None:
            click.echo(f"skipped  {doc.label()} (not a meshnet.dev/v1alpha1 resource)")
        elif not problems:
            click.echo(f"valid    {doc.label()}")
            for warning in warnings(doc):
                click.secho(f"  warning: {warning}", fg="yellow")
        else:
            click.secho(f"invalid  {doc.label()}", fg="red")
            for problem in problems:
                click.echo(f"  - {problem}")
    if any(results.values()):
        sys.exit(1)
