"""Git tree hashes of plain directories, so any source can be checked against the pin."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from meshnet.errors import PinError


def git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run git with a fixed identity and no user config; return stdout or raise PinError."""
    full_env = {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "meshnet",
        "GIT_AUTHOR_EMAIL": "meshnet@localhost",
        "GIT_COMMITTER_NAME": "meshnet",
        "GIT_COMMITTER_EMAIL": "meshnet@localhost",
        "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
        **(env or {}),
    }
    proc = subprocess.run(
        ["git", "-c", "core.autocrlf=false", "-c", "core.filemode=true", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise PinError(f"git {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def tree_hash(directory: Path) -> str:
    """The git tree id of every file under `directory` (ignore rules do not apply)."""
    with tempfile.TemporaryDirectory(prefix="meshnet-tree-") as scratch:
        git("init", "-q", scratch)
        env = {"GIT_DIR": str(Path(scratch) / ".git"), "GIT_WORK_TREE": str(directory)}
        git("add", "-A", "-f", ".", cwd=directory, env=env)
        return git("write-tree", cwd=directory, env=env)


def verify_tree(directory: Path, expected: str, what: str) -> None:
    """Refuse `directory` unless its tree hash is the pinned one."""
    actual = tree_hash(directory)
    if actual != expected:
        raise PinError(
            f"{what} at {directory} does not match the pin: expected git tree {expected}, "
            f"actual {actual}. The files differ from the pinned commit; refusing to use them."
        )
