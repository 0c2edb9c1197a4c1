"""What a network leg does to the bytes sent over it, as time: one-way delay, bandwidth
(serialisation and a queue), bounded jitter and loss as TCP feels it. Pure: the proxy
(`link_proxy`) asks when each chunk arrives and holds it until then.

TCP never drops or reorders data for its reader; a lost segment only arrives late, and
everything after it waits behind it (head-of-line blocking). So a link here delays, never
drops: a chunk carrying a lost segment arrives one tail-loss probe later (RFC 8985: 2 x the
round trip, at least 10 ms), and no chunk arrives before the one sent ahead of it."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, replace

SEGMENT_BYTES = 1448  # a TCP segment's payload on a 1500-byte Ethernet MTU
MIN_PROBE_S = 0.010  # RFC 8985's floor on the probe timeout


@dataclass(frozen=True)
class Link:
    """One leg, the same in each direction (each direction has its own queue)."""

    delay_s: float = 0.0
    bandwidth_bps: float | None = None  # bits/s per direction; None: unlimited
    jitter_s: float = 0.0  # each chunk is late by up to this, uniformly (order kept)
    loss: float = 0.0  # fraction of TCP segments lost (and retransmitted)

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0:
            raise ValueError("a link's delay and jitter cannot be negative")
        if self.bandwidth_bps is not None and self.bandwidth_bps <= 0:
            raise ValueError("a link's bandwidth must be positive")
        if not 0 <= self.loss < 1:
            raise ValueError("a link's loss is a fraction in [0, 1)")

    @property
    def retransmit_s(self) -> float:
        """What a lost segment costs: the tail-loss probe, 2 x RTT (RTT = 2 x one-way)."""
        return max(4 * self.delay_s, MIN_PROBE_S)

    def serialise_s(self, nbytes: int) -> float:
        return 0.0 if self.bandwidth_bps is None else nbytes * 8 / self.bandwidth_bps

    def describe(self) -> str:
        parts = [f"{self.delay_s * 1000:g} ms"]
        if self.bandwidth_bps is not None:
            parts.append(f"{format_rate(self.bandwidth_bps)}")
        if self.jitter_s:
            parts.append(f"jitter {self.jitter_s * 1000:g} ms")
        if self.loss:
            parts.append(f"loss {self.loss * 100:g}%")
        return ", ".join(parts)


@dataclass(frozen=True)
class Profile:
    name: str
    link: Link
    source: str  # where its numbers come from


# One-way delays are half the round trips quoted for each kind of path; bandwidths are
# what one flow gets, per direction.
PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("loopback", Link(),
            "no shaping at all: what the machine's own TCP does"),
    Profile("same-rack", Link(0.00005, 25e9),
            "two hosts on one top-of-rack switch: ~0.1 ms round trip on 25 GbE NICs, the "
            "common cloud and GPU-server port"),
    Profile("one-region", Link(0.001, 10e9),
            "two availability zones of one cloud region: ~1-2 ms round trip, 10 Gbit/s "
            "for one flow between large instances"),
    Profile("one-continent", Link(0.015, 1e9),
            "two cities of one continent (e.g. Frankfurt to Madrid): ~30 ms round trip, "
            "1 Gbit/s for one long-haul flow"),
    Profile("consumer", Link(0.030, 100e6, 0.005, 0.001),
            "home machines on fibre or cable in different countries: ~60 ms round trip, "
            "100 Mbit/s upload (the sender's uplink bounds each direction), a few ms of "
            "jitter from the access network's queues, 0.1% loss"),
)}

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def parse_rate(text: str) -> float:
    """'100M', '1.5G', '800k' (bits/s)."""
    match = re.fullmatch(r"([0-9.]+)\s*([kmg]?)(?:bit/s|bps|b)?", text.strip().lower())
    if not match:
        raise ValueError(f"not a bandwidth: {text!r} (e.g. 100M, 1G)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_time(text: str) -> float:
    """'30ms', '0.05ms', '1s' (seconds)."""
    match = re.fullmatch(r"([0-9.]+)\s*(s|ms|us)", text.strip().lower())
    if not match:
        raise ValueError(f"not a duration: {text!r} (e.g. 30ms)")
    return float(match.group(1)) * _TIME[match.group(2)]


def format_rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


def parse_link(text: str) -> Link:
    """A profile name with optional overrides: 'consumer', 'one-continent:delay=20ms',
    'consumer:bw=50M,jitter=2ms,loss=0.5%'."""
    name, _, overrides = text.partition(":")
    if name not in PROFILES:
        raise ValueError(f"unknown link profile {name!r}; known: {', '.join(PROFILES)}")
    link = PROFILES[name].link
    for item in filter(None, (part.strip() for part in overrides.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"a link override is key=value, got {item!r}")
        if key == "delay":
            link = replace(link, delay_s=parse_time(value))
        elif key == "bw":
            link = replace(link, bandwidth_bps=None if value == "inf" else parse_rate(value))
        elif key == "jitter":
            link = replace(link, jitter_s=parse_time(value))
        elif key == "loss":
            percent = value.endswith("%")
            link = replace(link, loss=float(value.rstrip("%")) / (100 if percent else 1))
        else:
            raise ValueError(f"unknown link override {key!r} (delay, bw, jitter, loss)")
    return link


class Direction:
    """One direction of a leg: when each chunk, sent at `now`, reaches the other end."""

    def __init__(self, link: Link, rng: random.Random | None = None) -> None:
        self.link = link
        self._rng = rng or random.Random()
        self._wire_free = 0.0  # when the last queued byte has left the sender
        self._last_arrival = 0.0

    def queued_s(self, now: float) -> float:
        """How long the bytes already queued still take to leave the sender."""
        return max(0.0, self._wire_free - now)

    def arrival(self, now: float, nbytes: int) -> float:
        link = self.link
        self._wire_free = max(now, self._wire_free) + link.serialise_s(nbytes)
        due = self._wire_free + link.delay_s
        if link.jitter_s:
            due += self._rng.uniform(0.0, link.jitter_s)
        if link.loss:
            segments = max(1, math.ceil(nbytes / SEGMENT_BYTES))
            if self._rng.random() < 1 - (1 - link.loss) ** segments:
                due += link.retransmit_s
        self._last_arrival = max(due, self._last_arrival)  # TCP delivers in order
        return self._last_arrival
