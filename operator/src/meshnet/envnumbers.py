"""Numeric settings read from the environment, refused with the variable's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from meshnet.errors import OperatorError

T = TypeVar("T", int, float)


def env_number(env: Mapping[str, str], key: str, default: T, kind: type[T]) -> T:
    """`env[key]` as a non-negative `kind`; `default` when unset or empty."""
    raw = env.get(key, "")
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise OperatorError(f"{key}={raw!r} is not a valid {kind.__name__}") from None
    if value < 0:
        raise OperatorError(f"{key}={raw!r} must not be negative")
    return value
