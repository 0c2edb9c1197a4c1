"""`meshnet worker`: build and run the C++ shard worker."""

from __future__ import annotations

import click

from meshnet.cli.pin import lane_option, say
from meshnet.native.build import build_worker
from meshnet.paths import repo_root, workspace
from meshnet.pin.manifest import load_manifest
from meshnet.pin.workspace import Workspace


@click.group("worker")
def command() -> None:
    """The C++ shard worker (meshnet-shard-worker) and its tools."""


@command.command("build")
@lane_option
@click.option("--dev", is_flag=True, help="Incremental build in the workspace (no cache key).")
@click.option(
    "--jobs", "-j", type=click.IntRange(1, 256), default=None, help="Parallel compile jobs."
)
def build_cmd(lane: str, dev: bool, jobs: int | None) -> None:
    """Build worker/ against the pinned llama.cpp (cached by source digest)."""
    root = repo_root()
    manifest = load_manifest(root / "llama-pin.yaml")
    build_worker(root, manifest, Workspace(workspace(root)), lane, say, dev=dev, jobs=jobs)
