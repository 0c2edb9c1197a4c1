"""Read what provisioning needs from one GGUF file's header, with the `gguf` package."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf

from meshnet.errors import IncompleteSplitSet

ScalarValue = int | float | str | bool
# Integer arrays up to this length are kept (a drafter's target layers); longer ones and the
# tokenizer's only by their length.
SHORT_ARRAY = 1024


@dataclass(frozen=True)
class GGUFHeader:
    """One file of a (possibly split) GGUF model: split keys, scalar metadata, short integer
    arrays, array lengths, tensor sizes."""

    name: str
    split_no: int | None = None
    split_count: int | None = None
    split_tensors: int | None = None
    metadata: dict[str, ScalarValue] = field(default_factory=dict)
    tensor_bytes: dict[str, int] = field(default_factory=dict)
    int_arrays: dict[str, tuple[int, ...]] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    @property
    def is_split(self) -> bool:
        return self.split_count is not None


def _take_int(metadata: dict[str, ScalarValue], key: str) -> int | None:
    value = metadata.pop(key, None)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_header(path: Path) -> GGUFHeader:
    """Parse the header of `path` (tensor data is memory-mapped, never read)."""
    try:
        reader = gguf.GGUFReader(path, "r")
    except (ValueError, OSError, IndexError) as exc:
        raise IncompleteSplitSet(f"{path.name} is not a readable GGUF file: {exc}") from None
    metadata: dict[str, ScalarValue] = {}
    int_arrays: dict[str, tuple[int, ...]] = {}
    array_lengths: dict[str, int] = {}
    for key, item in reader.fields.items():
        if key.startswith("GGUF.") or not item.types:
            continue
        if item.types[0] == gguf.GGUFValueType.ARRAY:
            array_lengths[key] = len(item.data)
            element = item.types[-1]
            short = len(item.data) <= SHORT_ARRAY and not key.startswith("tokenizer.")
            if short and element.name.startswith(("INT", "UINT")):
                int_arrays[key] = tuple(int(v) for v in item.contents())
            continue
        value = item.contents()
        if isinstance(value, int | float | str | bool):
            metadata[key] = value
    return GGUFHeader(
        name=path.name,
        split_no=_take_int(metadata, gguf.Keys.Split.LLM_KV_SPLIT_NO),
        split_count=_take_int(metadata, gguf.Keys.Split.LLM_KV_SPLIT_COUNT),
        split_tensors=_take_int(metadata, gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT),
        metadata=metadata,
        tensor_bytes={tensor.name: int(tensor.n_bytes) for tensor in reader.tensors},
        int_arrays=int_arrays,
        array_lengths=array_lengths,
    )
