"""`python -m meshnet.devtools`: put helm and kubectl in the cache; write tiny test models."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from meshnet.devtools.kube_tools import install
from meshnet.devtools.tiny_deepseek4 import QUANT_TYPES, SMALL, write_tiny_deepseek4
from meshnet.devtools.tiny_dspark import DSPARK, write_tiny_dspark


@click.group()
def main() -> None:
    """Developer tools for the meshnet repository."""


@main.command("install-kube-tools")
def install_kube_tools() -> None:
    """Install helm v4 and kubectl 1.35 into ~/.cache/meshnet/bin (idempotent)."""
    for name, path in install().items():
        click.echo(f"{name}: {path}")


@main.command("tiny-deepseek4")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--layers", type=click.IntRange(1, 512), default=SMALL.n_layer, show_default=True,
              help="Depth (43 is V4's: 3 hash-routed layers, then CSA/HCA between SWA ends).")
@click.option("--embd", type=click.IntRange(32, 4096), default=SMALL.n_embd, show_default=True,
              help="Residual width n_embd (a multiple of 32 for quantized experts).")
@click.option("--experts", "expert_type", type=click.Choice(sorted(QUANT_TYPES)), default="f32",
              show_default=True, help="Tensor type of the routed and shared experts.")
@click.option("--indexer-top-k", type=click.IntRange(1), default=SMALL.indexer_top_k,
              show_default=True,
              help="Compressed rows the indexer selects per query: it truly selects only past "
                   "4 x top-k positions (V4-Flash: 512).")
@click.option("--mtp-layers", type=click.IntRange(0, 1), default=0, show_default=True,
              help="MTP (nextn) blocks after the main layers, drawn from their own stream: the "
                   "main weights are the same bytes as without them.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Weights are drawn from this seed: the same seed writes the same bytes.")
def tiny_deepseek4(out: Path, layers: int, embd: int, expert_type: str, indexer_top_k: int,
                   mtp_layers: int, seed: int) -> None:
    """Write a tiny random-weight deepseek4 GGUF to OUT (for tests and trials)."""
    model = dataclasses.replace(SMALL, n_layer=layers, n_embd=embd, expert_type=expert_type,
                                indexer_top_k=indexer_top_k, mtp_layers=mtp_layers)
    try:
        write_tiny_deepseek4(out, model, seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(f"{out}: deepseek4, {layers} layers + {mtp_layers} MTP, n_embd {embd}, experts "
               f"{expert_type}, indexer top-k {indexer_top_k}, seed {seed}, "
               f"{out.stat().st_size} bytes")


def _layer_list(_ctx: click.Context, _param: click.Parameter, text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected layer numbers like 5,6,7") from None


@main.command("tiny-dspark")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target-layers", type=click.IntRange(1, 512), default=SMALL.n_layer,
              show_default=True, help="Main layers of the tiny deepseek4 target it drafts for.")
@click.option("--embd", type=click.IntRange(32, 4096), default=SMALL.n_embd, show_default=True,
              help="The target's n_embd (the drafter shares its widths and vocabulary).")
@click.option("--tapped", "tapped", callback=_layer_list,
              help="Target main layers whose outputs it reads, e.g. 5,6,7 (default: the last "
                   "--stages layers).")
@click.option("--stages", type=click.IntRange(1, 16), default=DSPARK.stages, show_default=True,
              help="Drafter stages (full V4 blocks, uncompressed sliding-window attention).")
@click.option("--block-size", type=click.IntRange(2, 64), default=DSPARK.block_size,
              show_default=True, help="Tokens drafted per pass, the anchor first.")
@click.option("--experts", "expert_type", type=click.Choice(sorted(QUANT_TYPES)),
              default=DSPARK.expert_type, show_default=True,
              help="Tensor type of the stages' routed and shared experts.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Weights are drawn from this seed: the same seed writes the same bytes.")
def tiny_dspark(out: Path, target_layers: int, embd: int, tapped: tuple[int, ...], stages: int,
                block_size: int, expert_type: str, seed: int) -> None:
    """Write a tiny random-weight DSpark drafter (a dflash GGUF) to OUT for a tiny deepseek4
    target of the given depth and width (its embeddings and head are the target's)."""
    target = dataclasses.replace(SMALL, n_layer=target_layers, n_embd=embd)
    drafter = dataclasses.replace(DSPARK, stages=stages, block_size=block_size,
                                  tapped_layers=tapped, expert_type=expert_type)
    try:
        write_tiny_dspark(out, target, drafter, seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    layers = ", ".join(str(layer) for layer in drafter.tapped(target))
    click.echo(f"{out}: dflash (DSpark), {stages} stages reading target layers {layers}, "
               f"block size {block_size}, experts {expert_type}, seed {seed}, "
               f"{out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
