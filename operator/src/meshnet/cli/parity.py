"""`meshnet parity`: prove that layer-range splits of a model compute what it computes unsplit."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from meshnet.cli.pin import lane_option
from meshnet.parity import DEFAULT_TOLERANCE, format_report, run_parity
from meshnet.paths import workspace
from meshnet.pin.workspace import Workspace


@click.command("parity")
@click.option(
    "--model", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="GGUF model file.",
)
@click.option(
    "--split", "splits", multiple=True, required=True, metavar="B:E,B:E,...",
    help="Stages covering all layers in order, e.g. 0:15,15:30; repeat for more splits.",
)
@click.option("--n-prompt", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Prompt tokens (one prefill step).")
@click.option("--n-decode", type=click.IntRange(0, 4096), default=32, show_default=True,
              help="Greedy decode steps after the prompt.")
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="CPU threads per stage (default: all cores).")
@click.option("--tolerance", type=click.FloatRange(min=0), default=DEFAULT_TOLERANCE,
              show_default=True, help="Largest accepted |logit difference|.")
@click.option("--boundary-dtype", type=click.Choice(["f32", "f16", "bf16"]), default="f32",
              show_default=True,
              help="Round every boundary to this wire type, as a route with that recipe does.")
@click.option("--perturb", type=float, default=0.0, hidden=True,
              help="Add this to every boundary value (self-test: the splits must then fail).")
@click.option("--gpu-layers", type=click.IntRange(0), default=0, show_default=True,
              help="Offload this many of the model's last layers (99: all), on both sides; "
                   "a host whose only Vulkan device is the software one runs on it.")
@lane_option
@click.option("--json", "as_json", is_flag=True, help="Print the tool's JSON report.")
def command(
    model: Path, splits: tuple[str, ...], n_prompt: int, n_decode: int,
    threads: int | None, tolerance: float, boundary_dtype: str, perturb: float,
    gpu_layers: int, lane: str, as_json: bool,
) -> None:
    """Run a prompt through MODEL unsplit and as each split's stages, and compare.

    Boundaries pass between stages in memory. A split passes when its greedy tokens equal
    the unsplit ones and no logit differs by more than the tolerance; each stage's weight
    and KV bytes are reported, and each seam says what crossed it (the residual's schema
    and shape: DENSE_RESIDUAL for llama, MHC_RESIDUAL for deepseek4; whether the token ids
    went beside it). Exits 1 when any split fails.
    """
    report = run_parity(
        model, splits, Workspace(workspace()),
        n_prompt=n_prompt, n_decode=n_decode, threads=threads, tolerance=tolerance,
        perturb=perturb, boundary_dtype=boundary_dtype, lane=lane, gpu_layers=gpu_layers,
    )
    click.echo(report.text if as_json else format_report(report))
    if not report.ok:
        sys.exit(1)
