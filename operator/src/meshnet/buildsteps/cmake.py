"""Run one CMake build step with a log file, [n/m] progress, and the log's tail on failure."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from meshnet.errors import MeshnetError

_STEP = re.compile(r"^\[(\d+)/(\d+)\]|^\[\s*(\d+)%\]")


class BuildError(MeshnetError):
    """A CMake configure/build/install step failed."""


def run_logged(cmd: list[str], log: Path, progress: bool, label: str = "build") -> None:
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        last_shown = -10.0
        for line in proc.stdout:
            sink.write(line)
            match = _STEP.match(line)
            if progress and match:
                done, total, pct = match.groups()
                percent = float(pct) if pct else 100.0 * int(done) / int(total)
                if percent - last_shown >= 5 or percent >= 100:
                    last_shown = percent
                    print(f"  {label} {percent:5.1f}%  {line.strip()[:100]}", file=sys.stderr)
        code = proc.wait()
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise BuildError(f"{cmd[0]} failed (exit {code}); last lines of {log}:\n{tail}")


def generator_args() -> list[str]:
    """Ninja and ccache when present: faster, and ccache makes cold CI rebuilds cheap."""
    args = ["-G", "Ninja"] if shutil.which("ninja") else []
    if shutil.which("ccache"):
        args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
    return args
