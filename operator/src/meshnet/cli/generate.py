"""`meshnet generate`: run a prompt through a route of shard workers."""

from __future__ import annotations

import json
import sys

import click

from meshnet.cli.route_key import route_key_option
from meshnet.cli.tls import tls_client_options
from meshnet.gateway.chat import chat_prompt, chat_tokens
from meshnet.local.registry import entry_route_key, lookup
from meshnet.route import BoundaryCompression, PromptTooLong, RouteDriver, Sampling, TlsFiles
from meshnet.route.drafts import MAX_DRAFT, MAX_WINDOWS
from meshnet.route.route_key import RouteSecret

# The prompt does not fit the route's context: the request's fault, not the route's (1,
# as every meshnet error; 2, click's usage errors), so retrying as it is cannot help.
EXIT_PROMPT_TOO_LONG = 3


@click.command("generate")
@click.option("--stage", "stages", multiple=True, metavar="HOST:PORT",
              help="A stage's gRPC endpoint; repeat in pipeline order.")
@click.option("--route", "route_name", default=None, metavar="NAME",
              help="A route started by `meshnet up` on this machine (instead of --stage).")
@click.option("--prompt", required=True, help="Prompt text (tokenized by the route).")
@click.option("--chat", is_flag=True,
              help="Send the prompt as a user message in the model's chat template (the "
                   "answer is then the assistant's reply).")
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--temperature", type=click.FloatRange(0.0), default=0.0, show_default=True,
              help="0 is greedy.")
@click.option("--top-k", type=click.IntRange(0), default=0, show_default=True, help="0: off.")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True,
              help="0 or 1: off.")
@click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=0, show_default=True)
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the end-of-generation token.")
@click.option("--chunk", type=click.IntRange(1), default=None,
              help="Prefill chunk in tokens (default: the route's step limit).")
@click.option("--sample-locally", is_flag=True,
              help="Fetch logits and sample here instead of on the last stage (same result).")
@click.option("--topology", type=click.Choice(["auto", "chain", "hub", "ring"]), default="auto",
              show_default=True,
              help="chain: stages relay to their --next-stage; ring: a chain whose first "
                   "stage gets the last stage's tokens straight (--ring-last); hub: call "
                   "each stage; auto: ring, else chain, else hub, as the stages allow.")
@click.option("--speculate", type=click.IntRange(0, MAX_DRAFT), default=0, is_flag=False,
              flag_value=MAX_DRAFT, show_default=True, metavar="[K]",
              help="Speculative decoding: draft up to K tokens per step from the context "
                   "(prompt lookup; --speculate alone: 7, the most), verified exactly by the "
                   "route. Tokens are unchanged; used only where every stage can discard, "
                   "and only as wide as every stage measured exact (exact_step_rows): else "
                   "fewer drafts or plain decoding, with the reason shown.")
@click.option("--windows", type=click.IntRange(1, MAX_WINDOWS), default=1, show_default=True,
              help="With --speculate: verify windows a chain's or ring's first stage keeps in "
                   "flight (pipelined speculation, each drafted as if the ones before it were "
                   "accepted whole; a hub keeps one). Tokens are unchanged.")
@click.option("--boundary-compression", type=click.Choice([c.value for c in BoundaryCompression]),
              default=BoundaryCompression.OFF.value, show_default=True,
              help="The hub's legs (each stage's answer to this driver, this driver's request to "
                   "the next stage): shuffle-lz4 packs boundaries losslessly where the stage takes "
                   "it and is not on loopback. Pays only below the break-even bandwidth (about "
                   "400 Mbit/s at DeepSeek V4's width); a chain's legs are the workers' own "
                   "(--boundary-compression of meshnet-shard-worker). Tokens are unchanged.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: text, token ids, timings, recoveries.")
@tls_client_options
@route_key_option
def command(stages: tuple[str, ...], route_name: str | None, prompt: str, chat: bool,
            max_tokens: int,
            temperature: float, top_k: int, top_p: float, seed: int, ignore_eos: bool,
            chunk: int | None, sample_locally: bool, topology: str, speculate: int,
            windows: int, boundary_compression: str, as_json: bool, tls: TlsFiles | None,
            route_key: RouteSecret | None) -> None:
    """Generate text through a route's stages (streams the text as it comes).

    A generation stops at the end of the route's context (`stop: context`). Exit status:
    0 done, 1 the route failed, 2 a usage error, 3 the prompt alone is longer than the
    route's context."""
    stages = _endpoints(stages, route_name)
    if route_name is not None and route_key is None:  # `meshnet up` keeps the route's key
        route_key = entry_route_key(lookup(route_name))
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    with RouteDriver(list(stages), tls=tls, route_key=route_key, chunk_tokens=chunk,
                     sample_locally=sample_locally, topology=topology, speculate=speculate,
                     windows=windows,
                     boundary_compression=BoundaryCompression(boundary_compression)) as driver:
        route = driver.connect(wait=10.0)
        printer = _TextStream(driver) if not as_json else None
        try:
            request: str | list[int] = prompt
            if chat:  # tokenized as the gateway does: the user's text stays text
                marked = chat_prompt(route.chat_template, [{"role": "user", "content": prompt}])
                request = chat_tokens(marked, [prompt], driver.tokenize)
            generation = driver.generate(
                request, max_tokens=max_tokens, sampling=sampling, stop_at_eos=not ignore_eos,
                on_token=printer.add if printer else None,
            )
        except PromptTooLong as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(EXIT_PROMPT_TOO_LONG)
        if printer:
            printer.finish(generation.text)
            if generation.speculation_reason:
                click.secho(generation.speculation_reason, fg="yellow", err=True)
            if generation.load_dependent:
                click.secho("a stage batches for throughput (--batching throughput): these "
                            "tokens may depend on the route's load", fg="yellow", err=True)
            click.echo(
                f"[{len(generation.prompt_tokens)} prompt tokens at "
                f"{generation.prefill_tokens_per_second:.1f} tok/s, {len(generation.tokens)} "
                f"generated at {generation.decode_tokens_per_second:.1f} tok/s, "
                f"{generation.recoveries} recoveries, {generation.topology}, "
                + (f"{generation.accepted_draft_tokens}/{generation.draft_tokens} drafts "
                   f"accepted, " if generation.speculate else "")
                + f"stop: {generation.stop_reason}]",
                err=True,
            )
            return
        data = generation.to_json()
        data["route"] = {
            "route_id": route.route_id, "epoch": route.epoch,
            "manifest_digest": route.manifest_digest, "recipe_digest": route.recipe_digest,
            "stages": [{"endpoint": s.endpoint, "layers": [s.begin, s.end],
                        "incarnation": s.incarnation, "exact_step_rows": s.exact_step_rows,
                        "exact_batching": s.exact_batching,
                        "throughput_batching": s.throughput_batching} for s in route.stages],
            "seam_bytes_per_token": route.seam_bytes_per_token,
        }
        click.echo(json.dumps(data, indent=2))


def _endpoints(stages: tuple[str, ...], route_name: str | None) -> tuple[str, ...]:
    if bool(stages) == bool(route_name):
        raise click.UsageError("give either --route NAME or one --stage per stage")
    if route_name is None:
        return stages
    entry = lookup(route_name)
    return tuple(stage["endpoint"] for stage in entry["stages"])


class _TextStream:
    """Prints the text of the tokens so far as it grows (detokenizing the whole
    generation each time keeps multi-token characters whole)."""

    def __init__(self, driver: RouteDriver) -> None:
        self.driver = driver
        self.tokens: list[int] = []
        self.shown = ""

    def add(self, token: int) -> None:
        self.tokens.append(token)
        self._show(self.driver.detokenize(self.tokens))

    def _show(self, text: str) -> None:
        if text.startswith(self.shown) and not text.endswith("\ufffd"):
            sys.stdout.write(text[len(self.shown):])
            sys.stdout.flush()
            self.shown = text

    def finish(self, text: str) -> None:
        self._show(text)
        sys.stdout.write("\n")
