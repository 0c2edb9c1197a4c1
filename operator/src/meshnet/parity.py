"""Split parity: a model run as layer-range stages must compute what the unsplit model does.

The work happens in the C++ tool `meshnet-range-parity` (worker/tools), which loads the
GGUF unsplit and as the stages of each split, passes boundaries between stages in memory
and prints a JSON report; this module runs it and reads the report.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshnet.api.shardroute import LayerRange
from meshnet.errors import MeshnetError
from meshnet.local.vulkan import software_device_env
from meshnet.native.build import find_binary
from meshnet.pin.workspace import Workspace

TOOL = "meshnet-range-parity"
DEFAULT_TOLERANCE = 1e-4
EXIT_REFUSED = 2  # the tool's exit status for input it refuses (bad split, unreadable model)


class ParityError(MeshnetError):
    """The parity check could not run: a malformed split, an unreadable model, no tool."""


def parse_split(text: str) -> tuple[LayerRange, ...]:
    """`"0:15,15:30"` -> ranges; checks the form only (coverage needs the model: the tool)."""
    try:
        return tuple(LayerRange.parse(part) for part in text.split(","))
    except ValueError as error:
        raise ParityError(f"split {text!r}: {error}") from None


@dataclass(frozen=True)
class StageFootprint:
    """What one stage actually allocated."""

    begin: int
    end: int
    weight_bytes: int
    kv_bytes: int


@dataclass(frozen=True)
class Seam:
    """What crossed one stage boundary: the residual's schema and row shape, its wire type,
    whether the token ids went beside it (hash-routed layers), and its bytes per token."""

    after_layer: int
    schema: str  # DENSE_RESIDUAL | MHC_RESIDUAL
    row_shape: tuple[int, ...]
    dtype: str
    token_sideband: bool
    bytes_per_token: int

    def __str__(self) -> str:
        sideband = " + token ids" if self.token_sideband else ""
        return (f"after layer {self.after_layer}: {self.schema}{list(self.row_shape)} "
                f"{self.dtype}{sideband}, {self.bytes_per_token} bytes/token")


@dataclass(frozen=True)
class SplitResult:
    split: str
    ok: bool
    greedy_identical: bool
    max_abs_logit_diff: float | None  # None: a non-finite difference
    first_divergence: int | None  # index of the first greedy token that differs
    stages: tuple[StageFootprint, ...]
    seams: tuple[Seam, ...]
    error: str | None
    seconds: float


@dataclass(frozen=True)
class ParityReport:
    ok: bool
    model: str
    arch: str
    n_layer: int
    n_prompt: int
    n_decode: int
    tolerance: float
    boundary_dtype: str
    reference: StageFootprint
    splits: tuple[SplitResult, ...]
    raw: dict[str, Any]  # the tool's JSON report
    text: str  # the same, exactly as the tool printed it


def _stage(data: dict[str, Any]) -> StageFootprint:
    return StageFootprint(
        begin=int(data["begin"]), end=int(data["end"]),
        weight_bytes=int(data["weight_bytes"]), kv_bytes=int(data["kv_bytes"]),
    )


def _seam(data: dict[str, Any]) -> Seam:
    return Seam(
        after_layer=int(data["after_layer"]), schema=str(data["schema"]),
        row_shape=tuple(int(d) for d in data["row_shape"]), dtype=str(data["dtype"]),
        token_sideband=bool(data["token_sideband"]), bytes_per_token=int(data["bytes_per_token"]),
    )


def parse_report(data: dict[str, Any], text: str = "") -> ParityReport:
    splits = tuple(
        SplitResult(
            split=str(s["split"]),
            ok=bool(s["ok"]),
            greedy_identical=bool(s["greedy_identical"]),
            max_abs_logit_diff=(
                None if s["max_abs_logit_diff"] is None else float(s["max_abs_logit_diff"])
            ),
            first_divergence=(
                None if s["first_divergence"] is None else int(s["first_divergence"])
            ),
            stages=tuple(_stage(stage) for stage in s["stages"]),
            seams=tuple(_seam(seam) for seam in s.get("seams", ())),
            error=s.get("error"),
            seconds=float(s["seconds"]),
        )
        for s in data["splits"]
    )
    return ParityReport(
        ok=bool(data["ok"]),
        model=str(data["model"]),
        arch=str(data["arch"]),
        n_layer=int(data["n_layer"]),
        n_prompt=int(data["n_prompt"]),
        n_decode=int(data["n_decode"]),
        tolerance=float(data["tolerance"]),
        boundary_dtype=str(data.get("boundary_dtype", "f32")),
        reference=_stage(data["reference"]["stages"][0]),
        splits=splits,
        raw=data,
        text=text or json.dumps(data, indent=2),
    )


def run_parity(
    model: Path,
    splits: Sequence[str],
    ws: Workspace,
    *,
    n_prompt: int = 64,
    n_decode: int = 32,
    threads: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    perturb: float = 0.0,
    boundary_dtype: str = "f32",
    timeout: float = 1800,
    lane: str = "cpu",
    gpu_layers: int = 0,
    env: Mapping[str, str] | None = None,
) -> ParityReport:
    """Run every split against the unsplit model; ParityError when the tool refuses.

    `perturb` is added to every boundary value between stages: a self-test showing that
    the comparison catches a wrong boundary (the splits must then fail). `boundary_dtype`
    (f32, f16, bf16) rounds every boundary as a route with that recipe sends it.
    `lane`'s build runs it, with `gpu_layers` offloaded (on a host whose only Vulkan device
    is the software one, that device: local/vulkan.py); `env` adds to its environment.
    """
    if not splits:
        raise ParityError("at least one split is needed, e.g. 0:15,15:30")
    for split in splits:
        parse_split(split)
    cmd = [
        str(find_binary(TOOL, ws, lane)), "--model", str(model),
        "--n-prompt", str(n_prompt), "--n-decode", str(n_decode), "--tolerance", repr(tolerance),
    ]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if perturb:
        cmd += ["--perturb", repr(perturb)]
    if boundary_dtype != "f32":
        cmd += ["--boundary-dtype", boundary_dtype]
    if gpu_layers:
        cmd += ["--gpu-layers", str(gpu_layers)]
    for split in splits:
        cmd += ["--split", split]
    environment = {**os.environ, **(env or {})}
    if gpu_layers:
        environment.update(software_device_env(environment))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              env=environment)
    except subprocess.TimeoutExpired as exc:
        raise ParityError(f"{TOOL} did not finish within {timeout:.0f}s") from exc
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = None
    if not isinstance(data, dict) or "splits" not in data:
        reason = data.get("error") if isinstance(data, dict) else None
        if not reason:
            tail = proc.stderr.strip().splitlines()[-5:]
            reason = f"{TOOL} exited {proc.returncode} without a report: " + " | ".join(tail)
        raise ParityError(str(reason))
    return parse_report(data, proc.stdout.strip())


def _mib(n: int) -> str:
    return f"{n / (1 << 20):8.2f} MiB"


def format_report(report: ParityReport) -> str:
    """A human summary: one block per split, with each stage's footprint."""
    ref = report.reference
    lines = [
        f"model     {report.model} ({report.arch}, {report.n_layer} layers)",
        f"prompt    {report.n_prompt} tokens, then {report.n_decode} greedy decode steps; "
        f"tolerance {report.tolerance:g}; boundaries {report.boundary_dtype}",
        f"unsplit   weights {_mib(ref.weight_bytes)}   KV {_mib(ref.kv_bytes)}",
    ]
    for result in report.splits:
        worst = result.max_abs_logit_diff
        diff = "non-finite" if worst is None else f"{worst:g}"
        verdict = "identical" if result.ok else "DIFFERS"
        detail = f"greedy tokens {'identical' if result.greedy_identical else 'differ'}"
        if result.first_divergence is not None:
            detail += f" from token {result.first_divergence}"
        lines.append(f"split {result.split}: {verdict} (max |dlogit| {diff}, {detail})")
        if result.error:
            lines.append(f"  error: {result.error}")
        for stage in result.stages:
            lines.append(
                f"  stage {stage.begin:>3}:{stage.end:<3} weights {_mib(stage.weight_bytes)}   "
                f"KV {_mib(stage.kv_bytes)}"
            )
        lines.extend(f"  seam  {seam}" for seam in result.seams)
    return "\n".join(lines)
