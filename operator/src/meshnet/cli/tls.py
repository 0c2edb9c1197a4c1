"""--tls-ca/--tls-cert/--tls-key for commands that call workers, handed over as one `tls`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from meshnet.route.stage import TlsFiles

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def tls_client_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Adds the options; the command gets `tls`: the files, or None for plaintext."""
    @functools.wraps(command)
    def with_tls(*args: Any, tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None,
                 tls_server_name: str | None, **kwargs: Any) -> Any:
        tls = TlsFiles(tls_ca, tls_cert, tls_key, tls_server_name) \
            if (tls_ca or tls_cert) else None
        return command(*args, tls=tls, **kwargs)

    options = [
        click.option("--tls-ca", type=_FILE, default=None,
                     help="CA of the workers' certificates (enables TLS)."),
        click.option("--tls-cert", type=_FILE, default=None, help="Client certificate for mTLS."),
        click.option("--tls-key", type=_FILE, default=None, help="Client key for mTLS."),
        click.option("--tls-server-name", default=None,
                     help="Check the workers' certificate against this name instead of the"
                          " address dialled (e.g. stage.ROUTE.NAMESPACE, which the"
                          " operator's stage certificates carry, for workers dialled by IP)."),
    ]
    decorated: Callable[..., Any] = with_tls
    for option in reversed(options):
        decorated = option(decorated)
    return decorated
