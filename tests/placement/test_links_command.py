"""`meshnet links place` on loopback: four probe agents, one leg made slow and one thin by
link proxies; the command measures them as the proxies shape them and orders the ring
around the slow leg."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.devtools.link_model import Link
from meshnet.devtools.link_proxy import LinkProxy
from meshnet.placement.probe import Agent, Probe, ProbeError, time_link

MESHNET = Path(sys.executable).parent / "meshnet"


@pytest.fixture
def agents() -> Iterator[dict[str, str]]:
    """Four probe agents, as `meshnet links serve` runs them, by name."""
    processes = {name: subprocess.Popen([str(MESHNET), "links", "serve", "--listen",
                                         "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
                 for name in "abcd"}
    try:
        addresses = {}
        for name, process in processes.items():
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("probe agent listening on "), line
            addresses[name] = line.split()[-1]
        yield addresses
    finally:
        for process in processes.values():
            process.terminate()
            process.wait(10)


def port(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_the_ring_is_ordered_around_a_planted_slow_leg(agents: dict[str, str]) -> None:
    slow = Link(delay_s=0.025)  # a and b: 50 ms round trip, both ways
    thin = Link(bandwidth_bps=20e6)  # c to d: 20 Mbit/s
    proxies = {("a", "b"): LinkProxy(port(agents["b"]), slow),
               ("b", "a"): LinkProxy(port(agents["a"]), slow),
               ("c", "d"): LinkProxy(port(agents["d"]), thin)}
    try:
        via = [f"--via={a},{b}={proxy.endpoint}" for (a, b), proxy in proxies.items()]
        done = subprocess.run(
            [str(MESHNET), "links", "place", *(f"{n}={a}" for n, a in agents.items()), *via,
             "--rounds", "3", "--probe-bytes", "1M", "--json"],
            capture_output=True, text=True, timeout=300)
    finally:
        for proxy in proxies.values():
            proxy.stop()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    measured = {(link["from"], link["to"]): link for link in result["links"]}
    assert len(measured) == 12
    assert measured["a", "b"]["rttSeconds"] >= 0.050
    assert measured["b", "a"]["rttSeconds"] >= 0.050
    assert measured["c", "d"]["bytesPerSecond"] == pytest.approx(20e6 / 8, rel=0.3)
    assert max(link["rttSeconds"] for pair, link in measured.items()
               if pair not in proxies) < 0.025
    legs = {(leg["from"], leg["to"]) for leg in result["legs"]}
    assert not legs & {("a", "b"), ("b", "a")}, result["order"]


def test_bad_machines_and_an_unreachable_agent_are_refused_by_name() -> None:
    for args, message in ((["a=nowhere"], "expected HOST:PORT"),
                          (["a=127.0.0.1:1", "b=127.0.0.1:2"], "probe agent 127.0.0.1:1")):
        done = subprocess.run([str(MESHNET), "links", "place", *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0
        assert message in done.stderr, done.stderr


def test_an_agent_with_a_token_refuses_requests_without_it() -> None:
    with Agent("127.0.0.1:0", token="s3cret") as agent:
        agent.serve_in_background()
        with pytest.raises(ProbeError, match="wrong or missing token"):
            time_link(agent.address, Probe(rounds=1, nbytes=1024))
        assert time_link(agent.address, Probe(rounds=1, nbytes=1024, token="s3cret")).rtt_s > 0
        agent.shutdown()
