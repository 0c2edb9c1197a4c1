"""`meshnet links`: measure the links between a route's machines and place its stages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from meshnet.placement.order import Links, MeasuredLink, Placement, PlacementError, place
from meshnet.placement.probe import Agent, Probe, ProbeError, measure, split_address
from meshnet.placement.report import ReportError, links_document

V4_ROW_BYTES = 4 * 4096 * 4  # DeepSeek V4's boundary row: 4 mHC streams of 4096 f32
_SIZE = re.compile(r"([0-9]+)\s*([kmg]?)i?b?")


def _size(text: str) -> int:
    """'8M', '512k', '1G' (binary multiples), or plain bytes."""
    match = _SIZE.fullmatch(text.strip().lower())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"not a size: {text!r} (e.g. 8M, 512k)")
    return int(match.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[match.group(2)]


@click.group("links")
def command() -> None:
    """Measure the network between a route's machines and order its stages by it."""


def _token(path: Path | None) -> str:
    return path.read_text().strip() if path else ""


token_option = click.option(
    "--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None, help="A secret every request must carry (agents dial what `measure` names:"
                       " give one whenever an agent listens beyond 127.0.0.1).")


@command.command("serve")
@click.option("--listen", default="127.0.0.1:7070", show_default=True,
              help="Address of this machine's probe agent (port 0: any free port).")
@token_option
def serve_cmd(listen: str, token_file: Path | None) -> None:
    """Run this machine's probe agent until interrupted."""
    try:
        host = split_address(listen)[0]
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--listen") from None
    if host not in ("127.0.0.1", "localhost", "::1") and not token_file:
        raise click.UsageError("an agent listening beyond loopback needs --token-file")
    with Agent(listen, _token(token_file)) as agent:
        click.echo(f"probe agent listening on {agent.address}")
        agent.serve_forever()


def _named(values: tuple[str, ...], option: str) -> dict[str, str]:
    named = {}
    for value in values:
        name, sep, address = value.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{value!r}: expected NAME=HOST:PORT", param_hint=option)
        try:
            split_address(address)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint=option) from None
        if name in named:
            raise click.BadParameter(f"{name} named twice", param_hint=option)
        named[name] = address
    return named


def _via(values: tuple[str, ...]) -> dict[tuple[str, str], str]:
    via = {}
    for value in values:
        pair, sep, address = value.partition("=")
        a, comma, b = pair.partition(",")
        if not sep or not comma or not a or not b:
            raise click.BadParameter(f"{value!r}: expected FROM,TO=HOST:PORT",
                                     param_hint="--via")
        via[a, b] = address
    return via


@command.command("place")
@click.argument("machines", nargs=-1, required=True, metavar="NAME=HOST:PORT...")
@click.option("--gateway", "gateways", multiple=True, metavar="NAME=HOST:PORT",
              help="A machine the gateway could run on (its agent's address); repeatable.")
@click.option("--topology", type=click.Choice(["ring", "chain"]), default="ring",
              show_default=True)
@click.option("--row-bytes", type=click.IntRange(1), default=V4_ROW_BYTES, show_default=True,
              help="One boundary row on the wire (default: DeepSeek V4's, f32).")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Round trips timed per link (the median is taken).")
@click.option("--probe-bytes", default="8M", show_default=True,
              help="Bytes sent to time each link's bandwidth (K, M, G suffixes).")
@click.option("--via", multiple=True, metavar="FROM,TO=HOST:PORT",
              help="The address FROM reaches TO's agent by, where not TO's own (NAT, "
                   "proxies); repeatable.")
@token_option
@click.option("--json", "as_json", is_flag=True, help="The links and the placement as JSON.")
@click.option("--termination-log", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write the measured links there, compact (the operator's"
                                 " measuring Job: its container's termination message).")
def place_cmd(machines: tuple[str, ...], gateways: tuple[str, ...], topology: str,
              row_bytes: int, rounds: int, probe_bytes: str, via: tuple[str, ...],
              token_file: Path | None, as_json: bool, termination_log: Path | None) -> None:
    """Measure every link between MACHINES (each running `meshnet links serve`), then
    print which machine should serve which stage, in order, and where the gateway runs."""
    stages, candidates = _named(machines, "MACHINES"), _named(gateways, "--gateway")
    try:
        nbytes = _size(probe_bytes)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--probe-bytes") from None
    agents = {**stages, **candidates}
    probe = Probe(rounds, nbytes, _token(token_file))

    def said(a: str, b: str, link: MeasuredLink) -> None:
        if not as_json:
            click.echo(f"  {a} -> {b}: {_describe(link)}", err=True)

    try:
        links = measure(agents, probe, _via(via), said)
        best = place(list(stages), links, row_bytes, topology, list(candidates))
        if termination_log:
            termination_log.write_text(links_document(list(agents), links))
    except (ProbeError, PlacementError, ReportError) as error:
        if termination_log:  # the Job's reader shows why
            termination_log.write_text(str(error)[:1024])
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps(_as_json(best, links)))
        return
    click.echo(_summary(best, topology))


def _describe(link: MeasuredLink) -> str:
    return f"{link.rtt_s * 1000:.2f} ms round trip, {link.bytes_per_s * 8 / 1e6:.1f} Mbit/s"


def _summary(best: Placement, topology: str) -> str:
    lines = [f"best {topology} order: " + " -> ".join(
        f"stage {i}: {name}" for i, name in enumerate(best.order)),
        f"network per token: {best.cycle_s * 1000:.2f} ms over {len(best.legs)} legs"]
    lines += [f"  {a} -> {b}: {seconds * 1000:.2f} ms" for a, b, seconds in best.legs]
    if best.gateway:
        lines.append(f"gateway: {best.gateway} ({best.gateway_s * 1000:.2f} ms round trip to"
                     f" stage 0)")
    return "\n".join(lines)


def _as_json(best: Placement, links: Links) -> dict[str, object]:
    return {"order": list(best.order), "gateway": best.gateway,
            "cycleSeconds": best.cycle_s, "gatewaySeconds": best.gateway_s,
            "legs": [{"from": a, "to": b, "seconds": s} for a, b, s in best.legs],
            "links": [{"from": a, "to": b, "rttSeconds": link.rtt_s,
                       "bytesPerSecond": link.bytes_per_s}
                      for (a, b), link in links.items()]}
