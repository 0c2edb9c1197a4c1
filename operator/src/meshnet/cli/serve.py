"""`meshnet serve`: the route's OpenAI-compatible gateway."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import click
from aiohttp import web

from meshnet.api.drafter_kind import DrafterKind
from meshnet.cli.route_key import route_key_option
from meshnet.cli.tls import tls_client_options
from meshnet.gateway.api_keys import ApiKeys, ApiKeysError
from meshnet.gateway.fleet import Fleet
from meshnet.gateway.routes import Endpoints, fixed_replicas, local_route
from meshnet.gateway.server import Gateway, GatewayConfig, build_app
from meshnet.route import TlsFiles
from meshnet.route.drafts import MAX_DRAFT, MAX_WINDOWS
from meshnet.route.route_key import RouteSecret


def split_listen(listen: str, option: str = "--listen") -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise click.BadParameter(f"{listen!r} is not HOST:PORT", param_hint=option)
    return host.strip("[]") or "127.0.0.1", int(port)


@click.command("serve")
@click.option("--route", "route_name", default=None, metavar="NAME",
              help="A route started by `meshnet up` on this machine (followed across epochs).")
@click.option("--stage", "stages", multiple=True, metavar="HOST:PORT",
              help="A stage's gRPC endpoint, in pipeline order (instead of --route): one "
                   "replica.")
@click.option("--replica", "replicas", multiple=True, metavar="HOST:PORT,HOST:PORT,...",
              help="One replica of the route: its stages' endpoints in pipeline order, "
                   "comma-separated (instead of --route or --stage; repeat per replica). "
                   "Sessions are spread over the ready ones and move when one dies.")
@click.option("--scaled-to-zero", is_flag=True,
              help="The route has no replica now (instead of --route, --stage or "
                   "--replica): every request is answered 503 with Retry-After, and counted.")
@click.option("--model", default=None,
              help="The model id clients ask for (default: the route's name).")
@click.option("--listen", default="127.0.0.1:8000", show_default=True, metavar="HOST:PORT",
              help="Where to serve HTTP (0.0.0.0:PORT for every interface).")
@click.option("--max-waiting", type=click.IntRange(0), default=16, show_default=True,
              help="Requests queued beyond the route's session slots before HTTP 429.")
@click.option("--recovery-wait", type=click.FloatRange(0), default=15.0, show_default=True,
              help="Seconds a generation that lost a stage waits for it to come back, or "
                   "(with replicas) for a free slot on another replica, before 503.")
@click.option("--drain-seconds", type=click.FloatRange(0), default=60.0, show_default=True,
              help="On SIGTERM, how long running requests may go on before they are cut (new "
                   "connections are refused at once): a rollout's old gateway pod drains.")
@click.option("--exit-with-parent", type=click.IntRange(2), default=None, metavar="PID",
              help="Stop once PID, this process's parent, is gone (`meshnet up` sets it).")
@click.option("--speculate", type=click.IntRange(0, MAX_DRAFT), default=0, is_flag=False,
              flag_value=MAX_DRAFT, show_default=True, metavar="[K]",
              help="Speculative decoding for every request: draft up to K tokens per step "
                   "(--speculate alone: 7, the most); the text is unchanged. Counted in usage "
                   "(completion_tokens_details) and /metrics (spec_decode).")
@click.option("--windows", type=click.IntRange(1, MAX_WINDOWS), default=1, show_default=True,
              help="With --speculate: verify windows a chain's or ring's first stage keeps in "
                   "flight (pipelined speculation, each drafted as if the ones before it were "
                   "accepted whole; a hub keeps one). Tokens are unchanged.")
@click.option("--drafter", type=click.Choice([kind.value for kind in DrafterKind]), default=None,
              help="The drafter the route's last stage hosts (the recipe's speculation mode "
                   "MTP or DSpark): the route is refused (DrafterMissing) while it does not.")
@click.option("--api-keys", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE",
              help="Ask every /v1/ request for one of these API keys (one per line, read again "
                   "when the file changes) as 'Authorization: Bearer KEY': 401 without. "
                   "/health, /ready and /metrics stay open.")
@click.option("--key-cache", type=click.Choice(["per-key", "shared"]), default="per-key",
              show_default=True,
              help="With --api-keys: each key's cached prompt prefixes are its own, or every "
                   "key's.")
@click.option("--cached-tokens", type=click.Choice(["report", "hide"]), default="report",
              show_default=True,
              help="Report usage.prompt_tokens_details.cached_tokens, or leave it out.")
@tls_client_options
@route_key_option
def command(route_name: str | None, stages: tuple[str, ...], replicas: tuple[str, ...],
            scaled_to_zero: bool, model: str | None, listen: str,
            max_waiting: int, recovery_wait: float, drain_seconds: float,
            exit_with_parent: int | None,
            speculate: int, windows: int, drafter: str | None, api_keys: Path | None,
            key_cache: str, cached_tokens: str, tls: TlsFiles | None,
            route_key: RouteSecret | None) -> None:
    """Serve one route over an OpenAI-compatible HTTP API until interrupted.

    POST /v1/chat/completions and /v1/completions (streaming or not), GET /v1/models
    (the route, while every stage answers), /health (liveness), /ready (the route is
    servable) and /metrics (Prometheus). Concurrent requests are concurrent sessions on
    the route, up to its session slots (summed over the ready replicas); then up to
    --max-waiting wait; beyond, 429.
    """
    # Whatever was inherited (a script's background job starts with SIGINT ignored):
    # Ctrl-C stops it, as SIGTERM does, once it serves (aiohttp's graceful exit).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    resolve = replica_source(route_name, stages, replicas, scaled_to_zero)
    name = model or route_name or "meshnet"
    host, port = split_listen(listen)
    try:
        keys = ApiKeys(api_keys) if api_keys is not None else None
    except ApiKeysError as exc:
        raise click.BadParameter(str(exc), param_hint="--api-keys") from None
    config = GatewayConfig(model=name, max_waiting=max_waiting, speculate=speculate,
                           windows=windows, share_cache_across_keys=key_cache == "shared",
                           report_cached_tokens=cached_tokens == "report")
    hosted = DrafterKind(drafter) if drafter else None
    gateway = Gateway(config, Fleet(resolve, tls, recovery_wait, hosted, route_key), keys)
    app = build_app(gateway)
    if exit_with_parent is not None:
        app.cleanup_ctx.append(_exit_with_parent(exit_with_parent))
    click.echo(f"serving {name} on http://{host}:{port}/v1", err=True)
    web.run_app(app, host=host, port=port, handler_cancellation=True, print=None,
                access_log=None, shutdown_timeout=drain_seconds)


def replica_source(route_name: str | None, stages: Sequence[str], replicas: Sequence[str],
                   scaled_to_zero: bool) -> Callable[[], dict[str, Endpoints]]:
    """Where the gateway finds the replicas: exactly one of --route, --stage, --replica
    and --scaled-to-zero (read only when asked)."""
    if [bool(route_name), bool(stages), bool(replicas), scaled_to_zero].count(True) != 1:
        raise click.UsageError("give one of --route NAME, one --stage per stage, one "
                               "--replica per replica, or --scaled-to-zero")
    if route_name:
        return local_route(route_name)
    groups = [list(stages)] if stages else [r.split(",") for r in replicas]
    if any(not all(group) for group in groups):
        raise click.BadParameter("a replica names each of its stages' HOST:PORT",
                                 param_hint="--replica")
    return fixed_replicas(groups)


def _exit_with_parent(parent: int) -> Callable[[web.Application], AsyncIterator[None]]:
    """A gateway whose `meshnet up` was killed must not hold its port forever."""
    async def watch(_: web.Application) -> AsyncIterator[None]:
        async def poll() -> None:
            while os.getppid() == parent:
                await asyncio.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)  # aiohttp's own clean shutdown

        task = asyncio.create_task(poll())
        yield
        task.cancel()

    return watch
