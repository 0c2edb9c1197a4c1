"""The one form of every time we write (conditions, events, summaries, reports): RFC 3339
in UTC to the second, with a 'Z' ("2026-11-29T12:00:00Z"), as Kubernetes writes them."""

from __future__ import annotations

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(FORMAT)


def utc_now() -> datetime:
    return datetime.now(UTC)


def now_rfc3339() -> str:
    return rfc3339(utc_now())


def unix_rfc3339(unix: float) -> str:
    return rfc3339(datetime.fromtimestamp(unix, UTC))


def parse_rfc3339(text: str) -> datetime | None:
    """None for text that is not a time (an absent or malformed field)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None
