"""`meshnet up`: run a ShardRoute on this machine with the local backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import click
from prometheus_client import start_http_server

from meshnet.api.shardroute import ShardRouteSpec
from meshnet.cli.serve import split_listen
from meshnet.errors import MeshnetError
from meshnet.local.backend import LocalBackend
from meshnet.local.manifests import (
    FileVersion,
    RouteFileError,
    check_same_route,
    file_version,
    load_route_file,
)
from meshnet.local.process import stop_process, worker_binary
from meshnet.local.restarts import DEFAULT_BUDGET
from meshnet.metrics.controller import OperatorMetrics
from meshnet.paths import cache_dir, repo_root
from meshnet.pin.manifest import load_manifest
from meshnet.reconcile.route.gateway_command import GatewayCommand, gateway_command


def say(message: str) -> None:
    click.echo(f"[up] {message}", err=True)


def _pin_digest() -> str:
    try:
        return load_manifest(repo_root() / "llama-pin.yaml").digest()
    except (MeshnetError, FileNotFoundError):
        return "unknown"


def local_gateway_command(route: dict[str, Any], listen: str,
                          api_keys: Path | None = None,
                          route_key_file: Path | None = None) -> GatewayCommand:
    """The gateway of the route file's ShardRoute as the operator renders it (its
    gateway settings, speculation and drain), placed here: on `listen`, following the
    route across epochs, restarts and scaling through the replicas `meshnet up` publishes,
    asking for the keys in `api_keys` (this machine's stand-in for spec.gateway.apiKeysSecret),
    proving the route's key in `route_key_file` to its stages."""
    spec = ShardRouteSpec.model_validate(route["spec"])
    return gateway_command(str(route["metadata"]["name"]), spec.gateway,
                           spec.recipe.speculation, spec.rollout.drain_seconds, listen,
                           local_route=True, api_keys=api_keys,
                           route_key_file=route_key_file)


def _start_gateway(command: GatewayCommand) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "meshnet.cli", *command.args(os.getpid())])


def _changed_flags(old: GatewayCommand, new: GatewayCommand) -> str:
    def values(command: GatewayCommand) -> dict[str, str]:
        args = command.args()[1:]  # after "serve": here every flag takes a value
        return dict(zip(args[::2], args[1::2], strict=True))

    before = values(old)
    return " ".join(f"{flag} {value}" for flag, value in values(new).items()
                    if before.get(flag) != value)


def _print_route(backend: LocalBackend) -> None:
    entry = backend.route_entry()
    replicas = entry["replicas"]
    if not replicas:
        click.echo(f"route {entry['name']} is scaled to zero replicas")
    else:
        click.echo(
            f"route {entry['name']} epoch {entry['epoch']} ready "
            f"(routeDigest {str(entry['routeDigest'])[:12]}):"
        )
    for replica in replicas:
        if len(replicas) > 1:
            click.echo(f"  replica {replica['replica']}:")
        for stage in replica["stages"]:
            click.echo(f"  {stage['name']:<12} layers {stage['layers']:<8} {stage['endpoint']}")
    if replicas:
        stages = " ".join(f"--stage {s['endpoint']}" for s in entry["stages"])
        click.echo(f"try: meshnet generate --route {entry['name']} --prompt 'Hello'   "
                   f"(or {stages})")
    if entry["gateway"]:
        click.echo(f"OpenAI-compatible API: {entry['gateway']}   (model {entry['name']!r})")


def _reload(backend: LocalBackend, path: Path, version: FileVersion) -> None:
    """Load the changed file; one that cannot be read or served is reported and ignored
    (the route runs on as it was), except the first, which there is nothing to run without."""
    try:
        if isinstance(version, str):
            raise RouteFileError(version)
        route_file = load_route_file(path)
        if backend.route_file is not None:
            check_same_route(backend.route_file, route_file)
        backend.load(route_file)
    except MeshnetError as exc:
        if backend.route_file is None:
            raise
        say(f"ignoring the changed file (epoch {backend.status.get('epoch')} runs on): {exc}")


def _stop_on_signal(_signum: int, _frame: FrameType | None) -> None:
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
@click.option(
    "--serve",
    default="127.0.0.1:8000",
    show_default=True,
    metavar="HOST:PORT",
    help="Serve the route's OpenAI-compatible API here (`meshnet serve`; '' disables).",
)
@click.option(
    "--metrics-listen",
    default="",
    metavar="HOST:PORT",
    help="Serve the operator's Prometheus metrics here ('' disables; workers have their own).",
)
@click.option(
    "--restart-budget",
    type=click.IntRange(0),
    default=DEFAULT_BUDGET,
    show_default=True,
    help="Restarts of one stage allowed within 10 minutes (each after a backoff of 1, 2, "
    "4 ... 30 s); one more crash stops every worker and exits 1, naming the stage's log.",
)
@click.option(
    "--api-keys",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="The gateway asks every /v1/ request for one of these API keys (one per line, read "
    "again when the file changes): what spec.gateway.apiKeysSecret is in a cluster.",
)
def command(
    path: Path, threads: int, interval: float, dev: bool, serve: str, metrics_listen: str,
    restart_budget: int, api_keys: Path | None,
) -> None:
    """Run the route in FILE on this machine until interrupted.

    Verifies (and copies to its storage hostPath) the ModelArtifact, starts one worker
    per stage of each replica (spec.replicas) on 127.0.0.1, and prints the route once every
    stage is ready. The file is watched: a changed stage layout starts epoch + 1, whose
    workers replace the old ones once they are ready; a changed `replicas` starts or stops
    whole replicas, leaving the others running. An edit that cannot be used (the file
    gone or unreadable, an invalid spec, a renamed route: its name is immutable) is
    reported once and the route runs on as it was. A worker that dies is restarted with
    backoff, within a budget (--restart-budget); its log stays in the cache's logs/
    folder. Each run writes the route a new key (route-keys/NAME.key in the cache, mode
    0600) that its workers ask of every caller of a session's RPCs; `meshnet generate` and
    `meshnet certify --route NAME` find it, others pass --route-key-file. Once the route
    is ready, its OpenAI-compatible gateway serves it on --serve, spreading sessions over
    the replicas, with the settings of spec.gateway. Ctrl-C (or
    SIGTERM) stops the gateway and every worker, also where SIGINT was inherited ignored.
    """
    # Whatever was inherited: a script's background job starts with SIGINT ignored.
    signal.signal(signal.SIGINT, _stop_on_signal)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    metrics = OperatorMetrics()
    if serve:
        split_listen(serve, "--serve")
    if metrics_listen:
        # The operator's endpoint, over the same registry the reconciles below fill.
        address, port = split_listen(metrics_listen, "--metrics-listen")
        start_http_server(port, addr=address, registry=metrics.registry)
        say(f"operator metrics on http://{metrics_listen}/metrics")
    backend = LocalBackend(
        worker_binary(dev), cache_dir() / "logs", _pin_digest(), say, threads=threads,
        metrics=metrics, gateway_url=f"http://{serve}/v1" if serve else None,
        restart_budget=restart_budget,
    )
    seen: FileVersion | None = None
    announced: tuple[object, ...] | None = None
    gateway: subprocess.Popen[bytes] | None = None
    running: GatewayCommand | None = None  # the gateway's command line
    try:
        while True:
            version = file_version(path)
            if version != seen:  # once per save, and once while it cannot be read
                seen = version
                _reload(backend, path, version)
            backend.reconcile()
            settled = backend.settled()
            state = (backend.status.get("epoch"), settled, len(backend.whole_replicas()))
            wanted = None
            if serve and backend.route_file is not None:
                wanted = local_gateway_command(backend.route_file.route, serve,
                                               api_keys.resolve() if api_keys else None,
                                               backend.route_key_file())
            if settled and wanted and gateway is not None and running and wanted != running:
                # a gateway edit (speculation, maxWaiting, drain): rolled as a Deployment is
                say(f"restarting the gateway with {_changed_flags(running, wanted)}")
                stop_process(gateway, running.grace_seconds)
                gateway, running = _start_gateway(wanted), wanted
            if settled and state != announced:
                if wanted and (gateway is None or gateway.poll() is not None):
                    gateway, running = _start_gateway(wanted), wanted
                _print_route(backend)
            announced = state
            time.sleep(interval)
    except KeyboardInterrupt:
        say("stopping ...")
    finally:
        if gateway is not None and running is not None:
            stop_process(gateway, running.grace_seconds)
        stopped = backend.shutdown()
        say(f"stopped {stopped} workers")
