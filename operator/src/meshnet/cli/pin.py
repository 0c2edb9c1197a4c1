"""`meshnet pin`: fetch, patch, build and report the pinned llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import click

from meshnet.paths import repo_root, workspace
from meshnet.pin.build import LANE_OPTIONS, build
from meshnet.pin.fetch import fetch
from meshnet.pin.manifest import PinManifest, load_manifest
from meshnet.pin.patch import apply_patches, export_patches
from meshnet.pin.status import format_status, pin_status
from meshnet.pin.workspace import Workspace

lane_option = click.option(
    "--lane",
    type=click.Choice(sorted(LANE_OPTIONS)),
    default="cpu",
    show_default=True,
    help="Backend lane: selects the matching ggml build options.",
)

portable_option = click.option(
    "--portable", is_flag=True,
    help="The build images ship: shared libraries, the CPU backend for several CPU "
         "generations picked at run time, GPU code for the declared architectures "
         "(cached under ~/.cache/meshnet/portable/). Default: tuned to this machine.",
)


def say(message: str) -> None:
    click.echo(f"[pin] {message}", err=True)


def _context() -> tuple[Path, PinManifest, Workspace]:
    root = repo_root()
    return root, load_manifest(root / "llama-pin.yaml"), Workspace(workspace(root))


@click.group("pin")
def command() -> None:
    """The pinned llama.cpp: one exact commit, verified, patched and built.

    Reads llama-pin.yaml. The tree lives in the ignored workspace (.work/);
    builds are cached under ~/.cache/meshnet keyed by their input digests.
    """


@command.command("fetch")
@click.option("--force", is_flag=True, help="Discard the fetched tree and fetch again.")
def fetch_cmd(force: bool) -> None:
    """Fetch the pinned tree from the first accepted source and verify its git tree hash."""
    _, manifest, ws = _context()
    fetch(manifest, ws, say, force=force)


@command.command("patch")
@click.option("--force", is_flag=True, help="Discard local commits or edits in the workspace.")
def patch_cmd(force: bool) -> None:
    """Apply patches/ in order onto a clean copy of the verified tree (safe to repeat)."""
    root, manifest, ws = _context()
    apply_patches(manifest, ws, root / "patches", say, force=force)


@command.command("build")
@lane_option
@click.option(
    "--jobs", "-j", type=click.IntRange(1, 256), default=None, help="Parallel compile jobs."
)
@portable_option
def build_cmd(lane: str, jobs: int | None, portable: bool) -> None:
    """Build the patched tree (a no-op when the cache already holds this exact build)."""
    _, manifest, ws = _context()
    build(manifest, ws, lane, say, jobs=jobs, portable=portable)


@command.command("status")
@lane_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status_cmd(lane: str, as_json: bool) -> None:
    """Show the pin, the applied patches, the build and the pin digest."""
    _, manifest, ws = _context()
    status = pin_status(manifest, ws, lane)
    click.echo(json.dumps(status, indent=2) if as_json else format_status(status))


@command.command("export-patches")
def export_cmd() -> None:
    """Write the workspace's commits on top of the pinned base to patches/ and the manifest.

    Developer workflow: edit and `git commit` inside .work/llama.cpp, then run this.
    """
    root, _, ws = _context()
    export_patches(root / "llama-pin.yaml", ws, root / "patches", say)
