"""--route-key-file for commands that call a route's stages, handed over as `route_key`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from meshnet.route.route_key import RouteKeyError, RouteSecret

ROUTE_KEY_HELP = ("The route's key (64 hex digits; `meshnet up` writes one per route, the "
                  "operator mounts it): stages started with --route-key-file serve only callers "
                  "that prove it.")


def route_key_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """Adds --route-key-file; the command gets `route_key`: the key, or None."""
    @functools.wraps(command)
    def with_key(*args: Any, route_key_file: Path | None, **kwargs: Any) -> Any:
        try:
            key = RouteSecret.load(route_key_file) if route_key_file else None
        except RouteKeyError as exc:
            raise click.BadParameter(str(exc), param_hint="--route-key-file") from None
        return command(*args, route_key=key, **kwargs)

    option = click.option("--route-key-file", type=click.Path(dir_okay=False, path_type=Path),
                          default=None, metavar="FILE", help=ROUTE_KEY_HELP)
    decorated: Callable[..., Any] = option(with_key)
    return decorated
