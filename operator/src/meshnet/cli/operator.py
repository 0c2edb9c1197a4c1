"""`meshnet operator`: run the ShardRoute operator (kopf) against a cluster."""

from __future__ import annotations

import click


@click.group("operator")
def command() -> None:
    """The Kubernetes operator for ShardRoute (and ModelArtifact) resources."""
