"""`meshnet demo`: the whole system on one machine, narrated step by step (`make demo`)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import click
import httpx
import yaml

from meshnet.bundled import smollm2_gguf
from meshnet.errors import MeshnetError
from meshnet.gateway.chat import chat_prompt, chat_tokens
from meshnet.local.process import free_port, stop_process
from meshnet.local.registry import RouteNotFound, lookup, process_alive
from meshnet.paths import repo_root
from meshnet.route import RouteDriver
from meshnet.unsplit import unsplit_tokens

PROMPT = "Write one sentence about why the sky is blue."
MAX_TOKENS = 48
TWO_STAGES = [("front", 0, 15), ("back", 15, 30)]
# How long `meshnet up` may take to stop its gateway and workers before it is killed (its
# workers and gateway then stop as their parent is gone).
UP_STOP_SECONDS = 60


def step(text: str) -> None:
    click.secho(f"\n== {text}", bold=True)


def wait_for_epoch(
    name: str, epoch: int, up: subprocess.Popen[str], timeout: float = 300
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise MeshnetError(f"meshnet up exited with {up.returncode}")
        try:
            entry = lookup(name)
            if entry.get("epoch") == epoch:
                return entry
        except RouteNotFound:
            pass
        time.sleep(0.3)
    raise MeshnetError(f"route {name} did not reach epoch {epoch} in {timeout:.0f}s")


def ask(entry: dict[str, Any]) -> str:
    """The driver's answer to the chat question, checked token for token against the
    unsplit model."""
    endpoints = [s["endpoint"] for s in entry["stages"]]
    click.echo(f"$ meshnet generate --route {entry['name']} --chat {PROMPT!r} "
               f"--max-tokens {MAX_TOKENS}")
    with RouteDriver(endpoints) as driver:
        driver.connect(wait=30)
        chat = chat_prompt(driver.route.chat_template, [{"role": "user", "content": PROMPT}])
        answer = driver.generate(chat_tokens(chat, [PROMPT], driver.tokenize),
                                 max_tokens=MAX_TOKENS)
    click.echo(f"answer: {answer.text.strip()}")
    reference = unsplit_tokens(smollm2_gguf(), answer.prompt_tokens, len(answer.tokens))
    same = reference == answer.tokens
    click.echo(
        f"prefill {answer.prefill_tokens_per_second:.1f} tok/s, decode "
        f"{answer.decode_tokens_per_second:.1f} tok/s over {len(entry['stages'])} stages; "
        f"identical to the unsplit model: {'yes' if same else 'NO'}"
    )
    if not same:
        raise MeshnetError("the split route's tokens differ from the unsplit model's")
    return answer.text


def ask_gateway(serve: str, name: str, expected: str) -> None:
    """The same question through the OpenAI-compatible API `meshnet up` serves."""
    click.echo(f"$ curl http://{serve}/v1/chat/completions -d '{{\"model\": \"{name}\", "
               f"\"messages\": [{{\"role\": \"user\", \"content\": {PROMPT!r}}}], "
               f"\"temperature\": 0, \"max_tokens\": {MAX_TOKENS}}}'")
    body = {"model": name, "messages": [{"role": "user", "content": PROMPT}],
            "temperature": 0, "max_tokens": MAX_TOKENS}
    deadline = time.monotonic() + 60
    while True:
        try:
            reply = httpx.post(f"http://{serve}/v1/chat/completions", json=body, timeout=120)
            if reply.status_code != 503 or time.monotonic() > deadline:
                break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)  # the gateway is starting, or has not seen the new epoch yet
    if reply.status_code != 200:
        raise MeshnetError(f"the gateway answered {reply.status_code}: {reply.text}")
    text = reply.json()["choices"][0]["message"]["content"]
    click.echo(f"answer: {text.strip()}")
    click.echo(f"the same text as the driver's: {'yes' if text == expected else 'NO'}")
    if text != expected:
        raise MeshnetError("the gateway's answer differs from the driver's")


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@click.command("demo")
def command() -> None:
    """Start the 3-stage SmolLM2 route, ask it, re-split it to 2 stages, ask again, stop."""
    # Whatever was inherited (`make demo` from a script's background starts with SIGINT
    # ignored): Ctrl-C, or SIGTERM, ends the demo through the cleanup below.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    example = repo_root() / "examples" / "local" / "smollm2-3stage.yaml"
    work = Path(tempfile.mkdtemp(prefix="meshnet-demo-"))
    route_file = work / "route.yaml"
    shutil.copy(example, route_file)
    serve = f"127.0.0.1:{free_port()}"
    step(f"1. meshnet up -f {example.relative_to(repo_root())}  (a copy, so the demo can edit it)")
    click.echo(
        "   verifies the ModelArtifact, then starts one worker per stage on 127.0.0.1"
        " (one thread each: only one stage computes at a time for one session)"
    )
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "meshnet.cli",
            "up",
            "-f",
            str(route_file),
            "--interval",
            "0.3",
            "--threads",
            "1",
            "--serve",
            serve,
        ],
        text=True,
    )
    finished = False
    try:
        first = wait_for_epoch("smollm2", 1, up)
        step("2. Ask the 3-stage route (layers 0:10, 10:20, 20:30)")
        text = ask(first)
        step("3. The same question through the route's OpenAI-compatible API")
        ask_gateway(serve, "smollm2", text)
        step("4. Edit the route file: two stages, 0:15 and 15:30 -> epoch 2")
        docs = list(yaml.safe_load_all(route_file.read_text()))
        docs[1]["spec"]["stages"] = [
            {"name": n, "layers": {"begin": b, "end": e}} for n, b, e in TWO_STAGES
        ]
        route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        second = wait_for_epoch("smollm2", 2, up)
        step("5. Ask the 2-stage route (epoch 2)")
        ask(second)
        finished = True
    finally:
        # on every path (an error, a timeout, Ctrl-C): what the demo started stops
        if finished:
            step("6. Stop meshnet up (SIGTERM, as Ctrl-C): it stops the gateway and every worker")
        else:
            click.echo("[demo] stopping meshnet up ...", err=True)
        stop_process(up, UP_STOP_SECONDS)
        shutil.rmtree(work, ignore_errors=True)
    left = [s["pid"] for s in second["stages"] if process_alive(s["pid"])]
    click.echo(f"workers left running: {len(left)}")
    step("Done. Next: `meshnet --help`, README.md, examples/ for a cluster.")
