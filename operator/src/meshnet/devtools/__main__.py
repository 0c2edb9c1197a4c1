"""`python -m meshnet.devtools install-kube-tools`: put helm and kubectl in the cache."""

from __future__ import annotations

import click

from meshnet.devtools.kube_tools import install


@click.group()
def main() -> None:
    """Developer tools for the meshnet repository."""


@main.command("install-kube-tools")
def install_kube_tools() -> None:
    """Install helm v4 and kubectl 1.35 into ~/.cache/meshnet/bin (idempotent)."""
    for name, path in install().items():
        click.echo(f"{name}: {path}")


if __name__ == "__main__":
    main()
