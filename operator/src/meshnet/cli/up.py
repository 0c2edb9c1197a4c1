"""`meshnet up`: run a ShardRoute on this machine with the local backend."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType

import click

from meshnet.errors import MeshnetError
from meshnet.local.backend import LocalBackend
from meshnet.local.manifests import load_route_file
from meshnet.paths import cache_dir, repo_root
from meshnet.pin.manifest import load_manifest
from meshnet.route.launch import worker_binary


def say(message: str) -> None:
    click.echo(f"[up] {message}", err=True)


def _pin_digest() -> str:
    try:
        return load_manifest(repo_root() / "llama-pin.yaml").digest()
    except (MeshnetError, FileNotFoundError):
        return "unknown"


def _print_route(backend: LocalBackend) -> None:
    entry = backend.route_entry()
    click.echo(
        f"route {entry['name']} epoch {entry['epoch']} ready "
        f"(routeDigest {str(entry['routeDigest'])[:12]}):"
    )
    for stage in entry["stages"]:
        click.echo(f"  {stage['name']:<12} layers {stage['layers']:<8} {stage['endpoint']}")
    stages = " ".join(f"--stage {s['endpoint']}" for s in entry["stages"])
    click.echo(f"try: meshnet generate --route {entry['name']} --prompt 'Hello'   (or {stages})")


def _stop_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@click.command("up")
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML with one ModelArtifact and one ShardRoute.",
)
@click.option(
    "--threads",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="CPU threads per worker (0: the worker decides).",
)
@click.option(
    "--interval",
    type=click.FloatRange(0.1),
    default=1.0,
    show_default=True,
    help="Seconds between reconciles (and checks of the file).",
)
@click.option("--dev", is_flag=True, help="Run the `worker build --dev` binary.")
def command(path: Path, threads: int, interval: float, dev: bool) -> None:
    """Run the route in FILE on this machine until interrupted.

    Verifies (and copies to its storage hostPath) the ModelArtifact, starts one worker
    per stage on 127.0.0.1, and prints the route once every stage is ready. The file is
    watched: a changed stage layout starts epoch + 1, whose workers replace the old ones
    once they are ready. A worker that dies is restarted with backoff. Ctrl-C stops
    every worker.
    """
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    backend = LocalBackend(
        worker_binary(dev), cache_dir() / "logs", _pin_digest(), say, threads=threads
    )
    seen_mtime = -1.0
    announced: tuple[object, object] | None = None
    try:
        while True:
            mtime = path.stat().st_mtime
            if mtime != seen_mtime:
                seen_mtime = mtime
                try:
                    backend.load(load_route_file(path))
                except MeshnetError as exc:
                    if backend.route_file is None:
                        raise
                    say(f"ignoring the changed file: {exc}")
            backend.reconcile()
            state = (backend.status.get("epoch"), backend.ready())
            if backend.ready() and state != announced:
                _print_route(backend)
            announced = state
            time.sleep(interval)
    except KeyboardInterrupt:
        say("stopping ...")
    finally:
        stopped = backend.shutdown()
        say(f"stopped {stopped} workers")
