"""Where `meshnet up` publishes its routes, so `meshnet generate --route NAME` finds them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from meshnet.errors import MeshnetError
from meshnet.paths import cache_dir
from meshnet.route.route_key import RouteSecret


class RouteNotFound(MeshnetError):
    """No running `meshnet up` serves a route of that name."""


def registry_dir() -> Path:
    return cache_dir() / "routes"


def publish(name: str, entry: dict[str, Any]) -> None:
    path = registry_dir() / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**entry, "pid": os.getpid()}, indent=2) + "\n")
    tmp.replace(path)


def withdraw(name: str) -> None:
    (registry_dir() / f"{name}.json").unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)
    return state != "Z"


def entry_route_key(entry: dict[str, Any]) -> RouteSecret | None:
    """The key of a published route (`meshnet up` writes one per route), None when it has none."""
    path = entry.get("routeKeyFile")
    return RouteSecret.load(Path(path)) if path else None


def lookup(name: str) -> dict[str, Any]:
    """The published route; refuses one whose `meshnet up` is gone."""
    path = registry_dir() / f"{name}.json"
    try:
        entry: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        known = sorted(p.stem for p in registry_dir().glob("*.json"))
        hint = f" (running: {', '.join(known)})" if known else " (none is running)"
        raise RouteNotFound(f"no route {name!r} started by `meshnet up`{hint}") from None
    if not process_alive(int(entry.get("pid", -1))):
        raise RouteNotFound(f"route {name!r}: its `meshnet up` (pid {entry.get('pid')}) is gone")
    return entry
