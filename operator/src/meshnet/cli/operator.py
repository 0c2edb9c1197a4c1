"""`meshnet operator`: run the ShardRoute operator (kopf) against a cluster."""

from __future__ import annotations

import asyncio
import logging
import os

import click

from meshnet.operator.kube import Connection
from meshnet.operator.run import run
from meshnet.operator.settings import OperatorSettings


@click.group("operator")
def command() -> None:
    """The Kubernetes operator for ShardRoute resources."""


@command.command("run")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Use this kubeconfig instead of the in-cluster service account.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def run_cmd(kubeconfig: str | None, verbose: bool) -> None:
    """Reconcile ShardRoutes until interrupted.

    Settings come from MESHNET_* environment variables (namespaces, worker images per
    lane, pin digest, Tracker URL and Secret, ports); see the Helm chart's values.
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per API call otherwise
    settings = OperatorSettings.from_env(os.environ)
    asyncio.run(run(settings, Connection.discover(kubeconfig)))
