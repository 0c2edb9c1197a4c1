"""The parity tool (meshnet-range-parity) and the real SmolLM2-135M Q4_1 GGUF it checks,
plus what each stage of a split should hold, computed from the GGUF with `gguf`."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import GGUFReader

from meshnet.native.build import find_binary
from meshnet.parity import TOOL
from meshnet.paths import workspace
from meshnet.pin.workspace import Workspace

# Tensors outside the repeating blocks and the stage that owns them (llama arch names).
INPUT_TENSORS = {"token_embd.weight"}
OUTPUT_TENSORS = {"output_norm.weight", "output.weight"}


@pytest.fixture(scope="session")
def parity_tool() -> Path:
    """The built meshnet-range-parity (MESHNET_BIN_DIR or the worker build); missing fails."""
    return find_binary(TOOL, Workspace(workspace()))


@pytest.fixture(scope="session")
def owned_tensor_bytes(smollm2: Path) -> Callable[[int, int], int]:
    """Bytes of the tensors a stage [begin, end) must hold: its blocks, the token
    embeddings only from layer 0, the output norm and head (the embeddings again when
    the head is tied to them) only up to the last layer."""
    reader = GGUFReader(smollm2)
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    n_layer = int(reader.fields["llama.block_count"].parts[-1][0])

    def expected(begin: int, end: int) -> int:
        total = 0
        for name, size in sizes.items():
            block = re.match(r"blk\.(\d+)\.", name)
            if block:
                total += size if begin <= int(block[1]) < end else 0
            elif name in INPUT_TENSORS:
                total += size if begin == 0 else 0
            elif name in OUTPUT_TENSORS:
                total += size if end == n_layer else 0
            else:
                raise AssertionError(f"tensor {name} has no owner in this test")
        if end == n_layer and "output.weight" not in sizes and begin > 0:
            total += sizes["token_embd.weight"]  # the tied head, loaded by the last stage
        return total

    return expected
