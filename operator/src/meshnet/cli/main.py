"""Entry point of the `meshnet` console script."""

from __future__ import annotations

import importlib
import sys

import click

from meshnet import __version__
from meshnet.errors import MeshnetError

# Command modules, each exposing a click command or group named `command`.
COMMAND_MODULES = [
    "meshnet.cli.pin",
    "meshnet.cli.artifact",
    "meshnet.cli.crds",
    "meshnet.cli.monitoring",
    "meshnet.cli.validate",
    "meshnet.cli.operator",
    "meshnet.cli.worker",
    "meshnet.cli.images",
    "meshnet.cli.up",
    "meshnet.cli.demo",
    "meshnet.cli.parity",
    "meshnet.cli.generate",
    "meshnet.cli.serve",
    "meshnet.cli.certify",
    "meshnet.cli.tracker",
    "meshnet.cli.links",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="meshnet")
def cli() -> None:
    """Meshnet shard fleet: serve one large GGUF model as a pipeline of layer ranges.

    Run `meshnet COMMAND --help` for the details of each command.
    """


for _module in COMMAND_MODULES:
    cli.add_command(importlib.import_module(_module).command)


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except MeshnetError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
