"""Byte progress for long work: a rich bar (bytes/s, ETA) on a terminal, log lines elsewhere."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class Meter(Protocol):
    """What the pull and hash loops report to; the CLI chooses how it is shown."""

    def describe(self, text: str) -> None: ...

    def advance(self, done: int) -> None: ...

    def log(self, text: str) -> None: ...


class NullMeter:
    def describe(self, text: str) -> None:
        pass

    def advance(self, done: int) -> None:
        pass

    def log(self, text: str) -> None:
        pass


class ByteMeter:
    """A rich progress bar over `total` bytes on stderr.

    Without a terminal (a Job's log) the live bar is replaced by one plain line every
    `log_every` seconds, so logs stay readable and still show rate and ETA.
    """

    def __init__(
        self, total: int, title: str, console: Console | None = None, log_every: float = 10.0
    ) -> None:
        self.console = console or Console(stderr=True)
        self.total = total
        self.title = title
        self.done = 0
        self.log_every = log_every
        self._started = time.monotonic()
        self._last_line = self._started
        self._live = self.console.is_terminal
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self._live,
            transient=False,
        )
        self._task: TaskID = self._progress.add_task(title, total=total)

    def __enter__(self) -> ByteMeter:
        self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def advance(self, done: int) -> None:
        self.done += done
        self._progress.advance(self._task, done)
        now = time.monotonic()
        if not self._live and now - self._last_line >= self.log_every:
            self._last_line = now
            self.console.print(self._status_line(now), highlight=False)

    def log(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def _status_line(self, now: float) -> str:
        rate = self.done / max(now - self._started, 1e-6)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        share = 100.0 * self.done / self.total if self.total else 100.0
        eta = f"{left:.0f}s" if left != float("inf") else "?"
        return (
            f"{self.title}: {self.done:,}/{self.total:,} bytes ({share:.0f}%) "
            f"{rate / 1e6:.1f} MB/s, ETA {eta}"
        )
