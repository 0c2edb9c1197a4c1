"""The one renderer of the gateway's command line (`meshnet serve`), for both backends: a
route's gateway settings, its recipe's speculation and its drain, and where a backend runs
the gateway (its listen address, how it finds the replicas, its TLS files) become serve's
flags. The gateway pod's container args and `meshnet up`'s gateway process are this."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.shardroute import Gateway, Speculation
from meshnet.reconcile.route.identity import LinkTls

GRACE_MARGIN_SECONDS = 10  # beyond the drain: the gateway's own shutdown after it


@dataclass(frozen=True)
class GatewayCommand:
    """`meshnet serve`'s flags, named as serve names them; None leaves a flag out."""

    model: str  # the model id clients ask for: the route's name
    listen: str
    # Where it finds the replicas: a route `meshnet up` runs on this machine (followed
    # across epochs through its registry), or else each replica's stage addresses in
    # pipeline order (none: the route is scaled to zero).
    local_route: str | None = None
    pipelines: tuple[tuple[str, ...], ...] = ()
    max_waiting: int = 16
    speculate: int = 0
    windows: int = 1
    drafter: DrafterKind | None = None  # the drafter the route's last stage must host
    drain_seconds: int = 0
    api_keys: PurePath | None = None  # the keys file, where the backend put it
    key_cache: str | None = None  # "shared": one key's cached prefixes are every key's
    cached_tokens: str | None = None  # "hide": usage without cached_tokens
    route_key_file: PurePath | None = None  # the route's key, where the backend put it
    tls_ca: PurePath | None = None
    tls_cert: PurePath | None = None
    tls_key: PurePath | None = None

    @property
    def grace_seconds(self) -> int:
        """How long whoever stops it waits after SIGTERM before it kills it."""
        return self.drain_seconds + GRACE_MARGIN_SECONDS

    def replica_args(self) -> list[str]:
        """One replica as `--stage` per stage, several as `--replica` per replica, none as
        `--scaled-to-zero`; a local route by name."""
        if self.local_route is not None:
            return ["--route", self.local_route]
        if not self.pipelines:
            return ["--scaled-to-zero"]
        if len(self.pipelines) == 1:
            return [arg for address in self.pipelines[0] for arg in ("--stage", address)]
        return [arg for pipeline in self.pipelines for arg in ("--replica", ",".join(pipeline))]

    def args(self, parent_pid: int | None = None) -> list[str]:
        """The `meshnet` command line (from `serve` on); `parent_pid`: --exit-with-parent.
        In the order the operator has always rendered, so an upgrade rolls no gateway."""
        flags: list[tuple[str, object]] = [
            ("--model", self.model),
            ("--listen", self.listen),
            ("--max-waiting", self.max_waiting),
            ("--speculate", self.speculate),
            ("--windows", self.windows),
            ("--drafter", self.drafter.value if self.drafter else None),
            ("--drain-seconds", self.drain_seconds),
            ("--api-keys", self.api_keys),
            ("--key-cache", self.key_cache),
            ("--cached-tokens", self.cached_tokens),
        ]
        after: list[tuple[str, object]] = [
            ("--route-key-file", self.route_key_file),
            ("--tls-ca", self.tls_ca),
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
            ("--exit-with-parent", parent_pid),
        ]
        return ["serve", *_render(flags), *self.replica_args(), *_render(after)]


def _render(flags: list[tuple[str, object]]) -> list[str]:
    return [text for flag, value in flags if value is not None for text in (flag, str(value))]


def gateway_command(name: str, gateway: Gateway, speculation: Speculation, drain_seconds: int,
                    listen: str, *, local_route: bool = False,
                    pipelines: Sequence[Sequence[str]] = (), tls: LinkTls | None = None,
                    tls_dir: PurePath | None = None,
                    api_keys: PurePath | None = None,
                    route_key_file: PurePath | None = None) -> GatewayCommand:
    """The gateway of route `name` listening on `listen`, finding its replicas in this
    machine's registry (`local_route`) or at `pipelines`, and, for a route with TLS,
    ca.crt (and, with client certificates required, the stages' own tls.crt and tls.key:
    the gateway is one of the route's) in `tls_dir`; its API keys file at `api_keys`; the
    route's key at `route_key_file`."""
    if tls is not None and tls_dir is None:
        raise ValueError("a gateway with TLS needs the directory of its certificates")
    if local_route and pipelines:
        raise ValueError("a gateway follows a local route or fixed pipelines, not both")
    files = tls_dir if tls is not None else None
    client = tls_dir if tls is not None and tls.require_client_cert else None
    return GatewayCommand(
        model=name,
        listen=listen,
        local_route=name if local_route else None,
        pipelines=tuple(tuple(pipeline) for pipeline in pipelines),
        max_waiting=gateway.max_waiting,
        drain_seconds=drain_seconds,
        api_keys=api_keys,
        route_key_file=route_key_file,
        key_cache="shared" if api_keys is not None and gateway.share_cache_across_keys else None,
        cached_tokens="hide" if gateway.hide_cached_tokens else None,
        tls_ca=files / "ca.crt" if files else None,
        tls_cert=client / "tls.crt" if client else None,
        tls_key=client / "tls.key" if client else None,
        # every request speculates as the recipe allows (0 drafts while it is disabled)
        speculate=speculation.loop_drafts(),
        windows=speculation.loop_windows(),
        drafter=speculation.stage_drafter(),  # the last stage must host it
    )
