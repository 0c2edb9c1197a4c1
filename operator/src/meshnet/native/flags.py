"""The worker's flag table as the built binary lists it (`meshnet-shard-worker
--print-flags`), and the blocks of docs/worker-flags.md written from it: the flag table
and the bounds of its numbers."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

DOC = Path("docs/worker-flags.md")
TABLE = "worker flags"
BOUNDS = "worker bounds"
_FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9-]*)")


@dataclass(frozen=True)
class WorkerFlag:
    """One row of the worker's flag table."""

    name: str
    metavar: str
    takes_value: bool
    default: str | None  # the value that gives the default; None: none, or derived
    default_note: str | None  # the default in words where there is no such value
    help: str
    min: int | None = None  # a number's bounds, where it has them
    max: int | None = None


def worker_flags(binary: Path) -> list[WorkerFlag]:
    """The flags `binary` parses, in its usage's order."""
    listing = subprocess.run([str(binary), "--print-flags"], capture_output=True, text=True,
                             check=True, timeout=30)
    return [WorkerFlag(**row) for row in json.loads(listing.stdout)]


def _cell(text: str) -> str:
    """Markdown table text: flags as code (outside the code already there), pipes escaped."""
    parts = text.split("`")
    return "`".join(_FLAG.sub(r"`\1`", part) if i % 2 == 0 else part
                    for i, part in enumerate(parts)).replace("|", "\\|")


def _default(flag: WorkerFlag) -> str:
    if flag.default is not None:
        return f"`{flag.default}`" if flag.default else "`''`"
    return _cell(flag.default_note) if flag.default_note else ("" if not flag.takes_value
                                                                 else "none")


def flags_table(flags: list[WorkerFlag]) -> str:
    """The markdown table of every flag: the flag, its default and what it does."""
    rows = ["| flag | default | what |", "| --- | --- | --- |"]
    for flag in flags:
        name = f"{flag.name} {flag.metavar}".strip().replace("|", "\\|")
        rows.append(f"| `{name}` | {_default(flag)} | {_cell(flag.help)} |")
    return "\n".join(rows) + "\n"


def _bound(flag: WorkerFlag) -> str:
    return f"at least {flag.min}" if flag.max is None else f"{flag.min} to {flag.max}"


def bounds_text(flags: list[WorkerFlag]) -> str:
    """One sentence naming every number's bounds, flags with the same bounds together."""
    groups: dict[str, list[str]] = {}
    for flag in flags:
        if flag.min is not None:
            groups.setdefault(_bound(flag), []).append(f"`{flag.name}`")
    parts = [f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
             for names in groups.values()]
    return ("Numbers outside their bounds are refused: "
            + "; ".join(f"{names} {bound}" for names, bound in zip(parts, groups, strict=True))
            + ".\n")


def markers(block: str) -> tuple[str, str]:
    """The comments around a written block of the doc."""
    return (f"<!-- begin {block}: written by `meshnet worker flags`, do not edit -->",
            f"<!-- end {block} -->")


def with_block(doc: str, block: str, text: str) -> str:
    """`doc` with the text between `block`'s markers replaced by `text`."""
    begin, end = markers(block)
    head, found_begin, rest = doc.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found_begin or not found_end:
        raise ValueError(f"{DOC} lacks the markers {begin!r} ... {end!r}")
    return f"{head}{begin}\n{text}{end}{tail}"


def with_worker_blocks(doc: str, flags: list[WorkerFlag]) -> str:
    """`doc` with the worker's flag table and bounds written from `flags`."""
    return with_block(with_block(doc, TABLE, flags_table(flags)), BOUNDS, bounds_text(flags))
