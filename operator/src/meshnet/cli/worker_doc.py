"""docs/worker-flags.md's blocks about the worker's callers, written from their code: the
options of `meshnet worker run` (its click command) and the worker flags it passes
through, and the flags the one renderer (meshnet.reconcile.route.worker_command) passes
for the operator and `meshnet up`."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path, PurePosixPath

import click

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.shardroute import LayerRange
from meshnet.local.stages import launch_spec
from meshnet.native.flags import WorkerFlag, flags_table, with_block, with_worker_blocks
from meshnet.reconcile.route.identity import LinkTls
from meshnet.reconcile.route.topology import StageLinks
from meshnet.reconcile.route.worker_command import worker_command
from meshnet.reconcile.route.workerspec import (
    Identities,
    LoopSpeculation,
    StageDrafter,
    WorkerSpec,
)

RUN_OPTIONS = "worker run options"
RUN_PASSES = "worker run passes"
RENDERED = "rendered flags"
RENDERED_SECTION = "## What the operator and `meshnet up` pass"


def _names(param: click.Option) -> list[str]:
    return [*param.opts, *param.secondary_opts]


def _metavar(param: click.Option, worker: dict[str, WorkerFlag]) -> str:
    """The worker's metavar for an option of its flag's name, else click's."""
    if param.is_flag:
        return ""
    if param.opts[0] in worker:
        return worker[param.opts[0]].metavar
    if param.metavar:
        return param.metavar
    if isinstance(param.type, click.Choice):
        return "|".join(str(choice) for choice in param.type.choices)
    return "N" if isinstance(param.type, click.types.IntParamType) else "TEXT"


def _default(param: click.Option) -> str:
    """The default as the table shows it ('' where the help says it)."""
    if param.required:
        return "required"
    if param.is_flag:
        on = param.default is True
        return ("on" if on else "off") if not param.secondary_opts else \
            f"`{param.opts[0] if on else param.secondary_opts[0]}`"
    return "" if param.default in (None, "") else f"`{param.default}`"


def run_options(command: click.Command, flags: list[WorkerFlag]) -> list[WorkerFlag]:
    """`meshnet worker run`'s own options as rows of a flag table; an option without help
    of its own is the worker flag of its name."""
    worker = {flag.name: flag for flag in flags}
    rows = []
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        name = " / ".join(_names(param))
        help_text = param.help or (f"the worker's {param.opts[0]}" if param.opts[0] in worker
                                   else "")
        rows.append(WorkerFlag(name=name, metavar=_metavar(param, worker), takes_value=True,
                               default=None, default_note=_default(param) or None,
                               help=help_text))
    return rows


def spelled_by_run(command: click.Command) -> set[str]:
    """Every option name `meshnet worker run` has, negative forms included."""
    return {name for param in command.params if isinstance(param, click.Option)
            for name in _names(param)}


def passes_text(command: click.Command, flags: list[WorkerFlag]) -> str:
    """Which worker flags `worker run` passes through, and which of its options are not
    the worker's."""
    own = spelled_by_run(command)
    worker = {flag.name for flag in flags}
    through = [f"`{flag.name}`" for flag in flags if flag.takes_value and flag.name not in own]
    not_worker = [f"`{param.opts[0]}`" for param in command.params
                  if isinstance(param, click.Option) and param.opts[0] not in worker]
    return (f"Passed through unchanged (no option of its own): {', '.join(through)}.\n\n"
            f"Its own, not the worker's: {', '.join(not_worker)}.\n")


def _every_feature() -> WorkerSpec:
    """A planned stage with every feature the planner can turn on, so that the renderer
    shows every flag it may pass."""
    return WorkerSpec(
        stage="first", layers=LayerRange(0, 1), route_id="ns/route", epoch=1,
        identities=Identities("m", "r", "d"), model_file="m.gguf", slots=1, context_length=16,
        boundary_dtype="f16", pipeline_depth=2, offload=True,
        tls=LinkTls(secret_name="tls", require_client_cert=True), route_key_secret="key",
        links=StageLinks(next_stage="second", ring_last="last"),
        drafter=StageDrafter(kind=DrafterKind.DSPARK, max_drafts=3, model_file="d.gguf"),
        loop=LoopSpeculation(drafts=3, windows=2), discard_depth=7, prefix_cache_entries=4,
        prefix_block=16, throughput_batching=True, compress_boundaries=True)


def rendered_flags() -> set[str]:
    """The flags the renderer passes for some stage: in a pod (the operator) or on
    loopback (`meshnet up`, which runs no TLS)."""
    spec = _every_feature()
    links = {"second": "second:1", "last": "last:1"}
    pod = worker_command(spec, PurePosixPath("/models/m.gguf"), "0.0.0.0:1", "0.0.0.0:2",
                         links, tls_dir=PurePosixPath("/tls"),
                         route_key_file=PurePosixPath("/key")).args()
    local = launch_spec(replace(spec, tls=None), Path("m.gguf"), threads=2, links=links,
                        route_key_file=Path("key")).args()
    return {arg for arg in [*pod, *local] if arg.startswith("--")}


def rendered_text(flags: list[WorkerFlag]) -> str:
    """The worker's flags the renderer passes for some stage, and those it never passes."""
    rendered = rendered_flags()
    passed = [f"`{flag.name}`" for flag in flags if flag.name in rendered]
    never = [f"`{flag.name}`" for flag in flags if flag.takes_value and flag.name not in rendered]
    return (f"Passed for some stage: {', '.join(passed)}.\n\n"
            f"Never passed (the worker's defaults): {', '.join(never)}.\n")


def unexplained(doc: str) -> list[str]:
    """The flags the renderer passes that the operator section's prose does not name (the
    written list aside): each needs a word on where its value comes from."""
    section = doc.partition(RENDERED_SECTION)[2].partition("\n## ")[0]
    begin, end = f"<!-- begin {RENDERED}:", f"<!-- end {RENDERED} -->"
    prose = section.partition(begin)[0] + section.partition(end)[2]
    return sorted(flag for flag in rendered_flags()
                  if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", prose))


def worker_doc(doc: str, flags: list[WorkerFlag], run: click.Command) -> str:
    """`doc` with every written block of docs/worker-flags.md rewritten."""
    doc = with_worker_blocks(doc, flags)
    doc = with_block(doc, RUN_OPTIONS, flags_table(run_options(run, flags)))
    doc = with_block(doc, RUN_PASSES, passes_text(run, flags))
    return with_block(doc, RENDERED, rendered_text(flags))
