"""`meshnet artifact`: describe, provision and verify a split-GGUF model artifact."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from meshnet.api.shardroute import LayerRange
from meshnet.artifacts.drafter import describe_drafter
from meshnet.artifacts.facts import ModelFacts, stage_footprint
from meshnet.artifacts.manifest import (
    artifact_document,
    build_manifest,
    default_name,
    render_document,
)
from meshnet.artifacts.progress import ByteMeter, Meter
from meshnet.artifacts.pull import FileOutcome, PullSummary, compact_json, pull
from meshnet.artifacts.sources import open_source
from meshnet.artifacts.spec import load_artifact
from meshnet.artifacts.verify import verify_folder
from meshnet.errors import ArtifactError, ArtifactSpecError

# Exit codes of `pull`, for the Job's backoff and the operator.
EXIT_RETRYABLE = 1
EXIT_PERMANENT = 3
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_LIMIT = 4096


@contextmanager
def _meter(total: int, title: str) -> Iterator[Meter]:
    with ByteMeter(total, title) as meter:
        yield meter


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


artifact_option = click.option(
    "--artifact",
    "artifact_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="ModelArtifact YAML (apiVersion meshnet.dev/v1alpha1) whose spec.files is the manifest;"
    " spec.source and spec.storage may be left out (as `manifest` writes it).",
)
full_option = click.option(
    "--full", is_flag=True,
    help="Hash every file, even those with a matching verified marker (a marker checks only"
    " size and mtime).",
)


@click.group("artifact")
def command() -> None:
    """Model artifacts: an exact split-GGUF model with a hashed manifest.

    `manifest` describes local files as a ModelArtifact; `pull` provisions one into a
    folder (what the operator's provisioning Job runs); `verify` re-checks a folder and
    prints the model's GGUF facts.
    """


@command.command("manifest")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the ModelArtifact YAML here instead of standard output.",
)
@click.option("--name", help="metadata.name (default: from the model's file name).")
@click.option(
    "--base-url", help="Set spec.source.http.baseURL: where pull downloads the files from."
)
def manifest_cmd(
    paths: tuple[Path, ...], out: Path | None, name: str | None, base_url: str | None
) -> None:
    """Hash a split-GGUF set and write a ModelArtifact with its manifestDigest.

    PATHS are GGUF files or folders (their *.gguf files). The set must be exactly one
    complete model: every split present once, consistent split headers, one
    architecture; otherwise nothing is written and the message says what is missing.
    It may add one DSpark drafter GGUF (architecture dflash) for that model: the header
    comment reports it, or the model's own MTP blocks (kind, the layers it reads, its
    vocabulary, its bytes); a drafter that does not fit the model is refused.
    """
    manifest = build_manifest(list(paths), _meter)
    document = artifact_document(manifest, name or default_name(manifest.model_file), base_url)
    text = render_document(document, manifest)
    if out:
        out.write_text(text)
        click.echo(
            f"wrote {out}: {len(manifest.entries)} file(s), manifestDigest {manifest.digest}",
            err=True,
        )
    else:
        click.echo(text, nl=False)


def _pull_detail(outcome: FileOutcome) -> str | None:
    if outcome.state == "skipped":
        return "verified marker matches"
    if outcome.state == "verified":
        return "already in place, hash ok"
    if outcome.state == "downloaded":
        return f"received {_mb(outcome.received)}"
    if outcome.state == "resumed":
        return f"resumed at {_mb(outcome.resumed_from)}, received {_mb(outcome.received)}"
    if outcome.state == "staged":
        return (f"received {_mb(outcome.received)}, verified; the file in place stays"
                " until every file verifies")
    if outcome.state == "failed":
        return "see below"
    return None  # never reached


def _print_pull(summary: PullSummary) -> None:
    for outcome in summary.files:
        detail = _pull_detail(outcome)
        if detail:
            click.echo(f"  {outcome.state:<10} {outcome.name}  ({detail})")
    if summary.ok and summary.facts:
        facts = summary.facts
        click.echo(
            f"verified {summary.message}; {facts.architecture}, {facts.layers} layers; "
            f"manifestDigest {summary.manifest_digest}"
        )


@command.command("pull")
@artifact_option
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to provision into (a PVC or host path mount; never under /home).",
)
@click.option(
    "--source-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Copy from this folder (where a source PVC is mounted) instead of HTTP.",
)
@full_option
@click.option(
    "--json", "as_json", is_flag=True, help="Print the summary as JSON on standard output."
)
@click.option(
    "--summary-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the compact JSON summary here (e.g. /dev/termination-log).",
)
def pull_cmd(
    artifact_file: Path,
    dest: Path,
    source_dir: Path | None,
    full: bool,
    as_json: bool,
    summary_file: Path | None,
) -> None:
    """Provision the artifact's files into DEST, resumably, and verify them.

    A file whose verified marker matches is skipped: the marker records size and mtime,
    so bytes changed in place with the mtime restored go unnoticed unless --full. Others
    are downloaded with HTTP Range resume into NAME.partial, hashed while written and
    checkpointed per chunk (a killed pull re-checks what it has from local disk and
    downloads only the rest), and renamed into place only when the sha256 matches; a file
    already in place is replaced only once every file verified, so a failed pull leaves the
    files in place and their markers as they were (bytes that did not verify go to
    DEST/.meshnet/quarantine/). Files come from spec.source, per-file urls, or
    --source-dir; nothing is written outside DEST (file names must be plain names,
    symbolic links there are not followed). Exit status:
    0 verified, 1 worth retrying (download failed, hash mismatch), 3 not worth retrying
    (spec, split set, storage).
    """
    try:
        artifact = load_artifact(artifact_file)
        if artifact.spec.source is None and source_dir is None \
                and not all(f.url for f in artifact.spec.files):
            raise ArtifactSpecError(
                f"{artifact_file} has no spec.source: set spec.source.http.baseURL (`meshnet"
                " artifact manifest --base-url URL`) or pass --source-dir"
            )
    except ArtifactSpecError as exc:
        summary = PullSummary("", "", str(dest), result=exc.reason, message=str(exc))
    else:
        try:
            with open_source(artifact.spec.source, source_dir) as source:
                summary = pull(artifact, dest, source, _meter, full=full)
        except ArtifactError as exc:
            summary = PullSummary(
                artifact.name,
                artifact.spec.manifest_digest(),
                str(dest),
                result=exc.reason,
                message=str(exc),
                retryable=exc.retryable,
            )
    report = summary.to_json()
    if summary_file:
        summary_file.write_text(compact_json(report, TERMINATION_LIMIT))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_pull(summary)
    if not summary.ok:
        click.secho(f"error: {summary.result}: {summary.message}", fg="red", err=True)
        sys.exit(EXIT_RETRYABLE if summary.retryable else EXIT_PERMANENT)


def _parse_range(text: str) -> tuple[int, int]:
    try:
        span = LayerRange.parse(text)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    return span.begin, span.end


def _format_facts(facts: ModelFacts, stages: list[tuple[int, int]]) -> list[str]:
    boundary = facts.boundary
    shape = "[" + ", ".join(str(n) for n in boundary.shape) + "]"
    lines = [
        f"architecture       {facts.architecture}",
        f"blocks             {facts.block_count}"
        + (
            f" ({facts.layers} main layers + {facts.block_count - facts.layers} MTP)"
            if facts.layers != facts.block_count
            else ""
        ),
        f"embedding length   {facts.embedding_length}",
        f"boundary           {boundary.schema} {shape}"
        + (" + token IDs" if boundary.token_ids else ""),
    ]
    if boundary.hash_layers:
        lines.append(
            f"hash-routed layers 0:{boundary.hash_layers} (a stage starting in 1:"
            f"{boundary.hash_layers} takes the token IDs beside the boundary)"
        )
    sizes = set(facts.layer_bytes)
    if len(sizes) == 1:
        lines.append(f"bytes per layer    {facts.layer_bytes[0]:,} (each of {facts.layers} layers)")
    else:
        lines.append(f"bytes per layer    {min(sizes):,} to {max(sizes):,} (see --json for each)")
    lines.append(
        f"token embeddings   {facts.input_bytes:,} (first stage"
        + (", and the last: tied output head)" if facts.tied_output else ")")
    )
    lines.append(f"output head        {facts.head_bytes:,} (last stage)")
    if facts.shared_bytes:
        lines.append(f"shared tensors     {facts.shared_bytes:,} (every stage)")
    if facts.drafter:
        lines.append(f"drafter            {describe_drafter(facts.drafter)} (last stage, when on)")
    for begin, end in stages or [(0, facts.layers)]:
        lines.append(
            f"stage [{begin}, {end})".ljust(19) + f"{stage_footprint(facts, begin, end):,} bytes"
        )
    return lines


@command.command("verify")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@artifact_option
@full_option
@click.option(
    "--stage",
    "stages",
    multiple=True,
    metavar="BEGIN:END",
    help="Also print the weight footprint of this layer range (repeatable).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report as JSON on standard output."
)
def verify_cmd(
    folder: Path, artifact_file: Path, full: bool, stages: tuple[str, ...], as_json: bool
) -> None:
    """Verify FOLDER against the manifest and print the model's GGUF facts.

    Files with a matching verified marker are trusted unless --full; a marker checks only
    size and mtime, so bytes changed in place with the mtime restored pass until --full.
    The others are hashed and get a marker, so an interrupted verify resumes where it
    stopped. Only spec.files and spec.expectations are read. Facts come from the GGUF
    headers: architecture, block count, embedding length, boundary schema and shape,
    bytes per layer for computing any stage's footprint, and the drafter (MTP blocks or a
    DSpark GGUF among the files) if the model has one.
    """
    ranges = [_parse_range(text) for text in stages]
    try:
        report = verify_folder(folder, load_artifact(artifact_file), _meter, full=full)
        footprints = {f"{b}:{e}": stage_footprint(report.facts, b, e) for b, e in ranges}
    except ArtifactError as exc:
        if as_json:
            click.echo(json.dumps({"result": exc.reason, "message": str(exc)}, indent=2))
        raise
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--stage") from None
    if as_json:
        click.echo(
            json.dumps(
                {"result": "Verified", **report.to_json(), "stageFootprints": footprints}, indent=2
            )
        )
        return
    how = {"marker": "verified marker", "hashed": "hashed"}
    click.echo(
        f"{report.artifact or folder}: {len(report.files)} file(s), "
        f"{_mb(sum(f.size for f in report.files))}, manifestDigest {report.manifest_digest}"
    )
    for check in report.files:
        click.echo(f"  ok  {check.name}  {_mb(check.size)}  ({how[check.how]})")
    for line in _format_facts(report.facts, ranges):
        click.echo(line)
