"""The unsplit reference: the whole model in one plain llama.cpp process.

Split routes must produce exactly these tokens; tests, the demo and certification ask
`meshnet-reference-generate` (built with the worker) for them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from meshnet.local.process import worker_binary


def reference_tool() -> Path:
    return worker_binary().parent / "meshnet-reference-generate"


def unsplit_tokens(
    model: Path, prompt_tokens: Sequence[int], n: int, *sampling: str, threads: int = 2
) -> list[int]:
    """Token ids the unsplit model generates after `prompt_tokens` (greedy unless `sampling`)."""
    result = subprocess.run(
        [
            str(reference_tool()),
            "--model",
            str(model),
            "--prompt-tokens",
            ",".join(map(str, prompt_tokens)),
            "-n",
            str(n),
            "--threads",
            str(threads),
            *sampling,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return list(json.loads(result.stdout)["tokens"])
