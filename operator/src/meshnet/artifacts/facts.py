"""GGUF facts of a whole model, derived purely from its ordered split headers.

Stage footprints follow the range-ownership rule of docs/architecture.md: a stage loads its
own layers, the token embeddings only when it starts at layer 0, and the output
head only when it ends at the last layer (a tied head needs the embeddings there too).
A drafter (MTP blocks, or a DSpark GGUF among the files) belongs to no stage's footprint:
only the last stage loads it, when the recipe turns it on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.artifacts.drafter import (
    DrafterFacts,
    check_drafter,
    dspark_drafter,
    mtp_drafter,
    split_drafter,
    vocab_size,
)
from meshnet.artifacts.gguf_header import GGUFHeader, ScalarValue
from meshnet.artifacts.splitset import order_split_set
from meshnet.errors import IncompleteSplitSet

DENSE_RESIDUAL = "DENSE_RESIDUAL"
MHC_RESIDUAL = "MHC_RESIDUAL"

_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.")
_INPUT_PREFIXES = ("token_embd.",)
_HEAD_PREFIXES = ("output.", "output_norm.", "output_hc_")  # output_hc_*: deepseek4's mHC head


@dataclass(frozen=True)
class Boundary:
    """What crosses a seam between two stages, per token."""

    schema: str
    shape: tuple[int, ...]
    token_ids: bool  # hash-routed layers need the token IDs beside the residual
    hash_layers: int = 0  # the first layers route experts by token id (deepseek4)


@dataclass(frozen=True)
class ModelFacts:
    architecture: str
    block_count: int  # `{arch}.block_count`, MTP blocks included
    layers: int  # main layers that stages partition (block_count minus MTP blocks)
    embedding_length: int
    boundary: Boundary
    layer_bytes: tuple[int, ...]  # bytes of each main layer's tensors, index = layer
    input_bytes: int  # token embeddings
    head_bytes: int  # output norm, output head (and mHC head)
    shared_bytes: int  # other global tensors every stage loads
    mtp_bytes: int  # MTP blocks: reserved, never loaded while MTP is off
    tied_output: bool  # no output.weight: the head reuses the token embeddings
    total_bytes: int  # the model's files, the drafter GGUF not included
    vocab_size: int = 0
    drafter: DrafterFacts | None = None

    def to_json(self) -> dict[str, Any]:
        document = {
            "architecture": self.architecture,
            "blockCount": self.block_count,
            "layers": self.layers,
            "embeddingLength": self.embedding_length,
            "boundary": {
                "schema": self.boundary.schema,
                "shape": list(self.boundary.shape),
                "tokenIds": self.boundary.token_ids,
                "hashLayers": self.boundary.hash_layers,
            },
            "bytesPerLayer": list(self.layer_bytes),
            "inputBytes": self.input_bytes,
            "headBytes": self.head_bytes,
            "sharedBytes": self.shared_bytes,
            "mtpBytes": self.mtp_bytes,
            "tiedOutput": self.tied_output,
            "tensorBytes": self.total_bytes,
            "vocabSize": self.vocab_size,
        }
        if self.drafter:
            document["drafter"] = self.drafter.to_json()
        return document


def _required_int(metadata: dict[str, ScalarValue], key: str, file: str) -> int:
    value = metadata.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise IncompleteSplitSet(f"{file} has no integer {key}: not a model this tool understands")
    return value


def artifact_facts(headers: Sequence[GGUFHeader]) -> ModelFacts:
    """Facts of an artifact's GGUF files: one complete model (split or not) and at most one
    DSpark drafter GGUF, which must fit the model (DrafterMismatch otherwise)."""
    model, drafter = split_drafter(headers)
    if not model:
        raise IncompleteSplitSet("a drafter GGUF but no model to draft for")
    return model_facts(order_split_set(model), drafter)


def model_facts(ordered: Sequence[GGUFHeader], drafter: GGUFHeader | None = None) -> ModelFacts:
    """Facts of a complete split set given in split order (see `order_split_set`), and of
    its drafter: the DSpark GGUF given, else the model's own MTP blocks."""
    first = ordered[0]
    arch = first.architecture or ""
    meta = first.metadata
    block_count = _required_int(meta, f"{arch}.block_count", first.name)
    n_embd = _required_int(meta, f"{arch}.embedding_length", first.name)
    nextn = meta.get(f"{arch}.nextn_predict_layers", 0)
    mtp_blocks = nextn if isinstance(nextn, int) and not isinstance(nextn, bool) else 0
    layers = block_count - mtp_blocks
    hc_mult = meta.get(f"{arch}.hyper_connection.count")
    hashed = meta.get(f"{arch}.hash_layer_count", 0)
    hash_layers = hashed if isinstance(hashed, int) and not isinstance(hashed, bool) else 0
    if isinstance(hc_mult, int) and hc_mult > 1:
        boundary = Boundary(MHC_RESIDUAL, (hc_mult, n_embd), hash_layers > 0, hash_layers)
    else:
        boundary = Boundary(DENSE_RESIDUAL, (n_embd,), hash_layers > 0, hash_layers)

    per_layer = [0] * layers
    input_bytes = head_bytes = shared_bytes = mtp_bytes = total = 0
    names: set[str] = set()
    for header in ordered:
        for name, size in header.tensor_bytes.items():
            names.add(name)
            total += size
            layer = _LAYER_TENSOR.match(name)
            if layer:
                index = int(layer.group(1))
                if index < layers:
                    per_layer[index] += size
                else:
                    mtp_bytes += size
            elif name.startswith(_INPUT_PREFIXES):
                input_bytes += size
            elif name.startswith(_HEAD_PREFIXES):
                head_bytes += size
            else:
                shared_bytes += size
    vocab = vocab_size(first)
    drafted = None
    if drafter is not None:
        drafted = dspark_drafter(drafter)
        check_drafter(drafted, layers, vocab)
    elif mtp_blocks:
        drafted = mtp_drafter(mtp_blocks, layers, vocab, mtp_bytes)
    return ModelFacts(
        architecture=arch,
        block_count=block_count,
        layers=layers,
        embedding_length=n_embd,
        boundary=boundary,
        layer_bytes=tuple(per_layer),
        input_bytes=input_bytes,
        head_bytes=head_bytes,
        shared_bytes=shared_bytes,
        mtp_bytes=mtp_bytes,
        tied_output="output.weight" not in names,
        total_bytes=total,
        vocab_size=vocab,
        drafter=drafted,
    )


def stage_footprint(facts: ModelFacts, begin: int, end: int) -> int:
    """Tensor bytes a stage owning layers [begin, end) loads (weights only, no KV)."""
    if not 0 <= begin < end <= facts.layers:
        raise ValueError(f"layer range [{begin}, {end}) is not within [0, {facts.layers})")
    footprint = sum(facts.layer_bytes[begin:end]) + facts.shared_bytes
    first, last = begin == 0, end == facts.layers
    if first or (last and facts.tied_output):
        footprint += facts.input_bytes
    if last:
        footprint += facts.head_bytes
    return footprint
