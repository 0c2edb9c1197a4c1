"""`python -m meshnet.devtools`: put helm and kubectl in the cache; write tiny test models."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from meshnet.devtools.kube_tools import install
from meshnet.devtools.tiny_deepseek4 import QUANT_TYPES, SMALL, write_tiny_deepseek4


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
@click.option("--seed", type=int, default=0, show_default=True,
              help="Weights are drawn from this seed: the same seed writes the same bytes.")
def tiny_deepseek4(out: Path, layers: int, embd: int, expert_type: str, indexer_top_k: int,
                   seed: int) -> None:
    """Write a tiny random-weight deepseek4 GGUF to OUT (for tests and trials)."""
    model = dataclasses.replace(SMALL, n_layer=layers, n_embd=embd, expert_type=expert_type,
                                indexer_top_k=indexer_top_k)
    try:
        write_tiny_deepseek4(out, model, seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(f"{out}: deepseek4, {layers} layers, n_embd {embd}, experts {expert_type}, "
               f"indexer top-k {indexer_top_k}, seed {seed}, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
