"""Builds too long for `make test` to pay (the CUDA lane's), checked wherever this machine
has made them: a build that was started and did not finish fails the test that needs it;
only one never made here, or one running right now, is skipped."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

# How CMake and ninja say a build failed, in the log the build keeps.
FAILURES = ("FAILED:", "CMake Error", "ninja: build stopped")


def finished_build(directory: Path, what: str, how: str) -> Path:
    """`directory` (a cache entry of ~/.cache/meshnet) once its build completed; `what`
    names it in the messages, `how` is the command that makes it."""
    if not directory.exists():
        pytest.skip(f"the {what} is not built on this machine for this pin and these sources "
                    f"({directory}): `{how}` builds it")
    with open(directory.parent / f"{directory.name}.lock", "w") as lock:
        try:  # the build holds it while it runs
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.skip(f"the {what} is being built right now in {directory}")
    if (directory / "complete.json").is_file():
        return directory
    log = directory / "build.log"
    text = log.read_text() if log.is_file() else ""
    failed = [line for line in text.splitlines() if line.startswith(FAILURES)]
    assert not failed, (f"the {what} build in {directory} failed; its log ends:\n"
                        + "\n".join(text.splitlines()[-30:]))
    pytest.skip(f"the {what} build in {directory} was stopped before it finished, with no "
                f"failure in its log: `{how}` builds it again (ccache keeps what it compiled)")
