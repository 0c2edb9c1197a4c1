"""The worker's flag table as the built binary lists it (`meshnet-shard-worker
--print-flags`), and the flag table of docs/worker-flags.md written from it."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

DOC = Path("docs/worker-flags.md")
BEGIN = "<!-- begin worker flags: written by `meshnet worker flags`, do not edit -->"
END = "<!-- end worker flags -->"
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


def worker_flags(binary: Path) -> list[WorkerFlag]:
    """The flags `binary` parses, in its usage's order."""
    listing = subprocess.run([str(binary), "--print-flags"], capture_output=True, text=True,
                             check=True, timeout=30)
    return [WorkerFlag(**row) for row in json.loads(listing.stdout)]


def _cell(text: str) -> str:
    """Markdown table text: flags as code, pipes escaped."""
    return _FLAG.sub(r"`\1`", text).replace("|", "\\|")


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


def with_table(doc: str, flags: list[WorkerFlag]) -> str:
    """`doc` with the text between its markers replaced by the table of `flags`."""
    head, begin, rest = doc.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{DOC} lacks the markers {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{flags_table(flags)}{END}{tail}"
