"""The drafter a model artifact carries, read purely from GGUF headers: the model's own MTP
blocks, or a DSpark drafter GGUF (architecture `dflash`) beside the model's files.

Either drafter reads hidden states of the model's last layers, so only the stage that owns
those layers can host it; `target_layers` says which (0-based main layers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.api.drafter_kind import DrafterKind
from meshnet.artifacts.gguf_header import GGUFHeader
from meshnet.errors import DrafterMismatch, IncompleteSplitSet

DRAFTER_ARCH = "dflash"
TOKENS_KEY = "tokenizer.ggml.tokens"
_D2T_BYTES_PER_ROW = 8  # llama.cpp asserts an I64 d2t


@dataclass(frozen=True)
class DrafterFacts:
    kind: DrafterKind
    blocks: int  # MTP blocks, or the DSpark drafter's stages
    target_layers: tuple[int, ...]  # main layers whose outputs it reads
    vocab_size: int
    draft_vocab: int  # tokens it drafts over: a reduced (d2t) vocabulary, else vocab_size
    block_size: int  # tokens one drafting pass proposes (DSpark), 1 for MTP
    total_bytes: int
    file: str | None = None  # the DSpark GGUF; None for MTP blocks inside the model

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "kind": self.kind.api_name,
            "blocks": self.blocks,
            "targetLayers": list(self.target_layers),
            "vocabSize": self.vocab_size,
            "draftVocab": self.draft_vocab,
            "blockSize": self.block_size,
            "tensorBytes": self.total_bytes,
        }
        if self.file:
            document["file"] = self.file
        return document


def is_drafter(header: GGUFHeader) -> bool:
    return header.architecture == DRAFTER_ARCH


def split_drafter(headers: Sequence[GGUFHeader]) -> tuple[list[GGUFHeader], GGUFHeader | None]:
    """The model's headers and the drafter's (if any) among an artifact's GGUF files."""
    drafters = [h for h in headers if is_drafter(h)]
    if len(drafters) > 1 or any(h.is_split for h in drafters):
        names = ", ".join(sorted(h.name for h in drafters))
        raise IncompleteSplitSet(f"more than one drafter file, or a split one: {names}")
    return [h for h in headers if not is_drafter(h)], (drafters[0] if drafters else None)


def vocab_size(header: GGUFHeader) -> int:
    return header.array_lengths.get(TOKENS_KEY, 0)


def mtp_drafter(blocks: int, layers: int, vocab: int, mtp_bytes: int) -> DrafterFacts:
    """MTP blocks read the last main layer's output and propose one token per pass."""
    return DrafterFacts(DrafterKind.MTP, blocks, (layers - 1,), vocab, vocab, 1, mtp_bytes)


def dspark_drafter(header: GGUFHeader) -> DrafterFacts:
    meta = header.metadata
    stored = header.int_arrays.get(f"{DRAFTER_ARCH}.target_layers")
    if not stored:
        raise DrafterMismatch(f"{header.name} names no {DRAFTER_ARCH}.target_layers")
    blocks = meta.get(f"{DRAFTER_ARCH}.block_count", 0)
    block_size = meta.get(f"{DRAFTER_ARCH}.block_size", 0)
    vocab = vocab_size(header)
    d2t = header.tensor_bytes.get("d2t")
    return DrafterFacts(
        kind=DrafterKind.DSPARK,
        blocks=blocks if isinstance(blocks, int) else 0,
        # llama.cpp numbers a layer's input: entry i is the output of main layer i - 1
        target_layers=tuple(layer - 1 for layer in stored),
        vocab_size=vocab,
        draft_vocab=d2t // _D2T_BYTES_PER_ROW if d2t else vocab,
        block_size=block_size if isinstance(block_size, int) else 0,
        total_bytes=sum(header.tensor_bytes.values()),
        file=header.name,
    )


def check_drafter(drafter: DrafterFacts, layers: int, vocab: int) -> None:
    """DrafterMismatch unless the drafter reads existing main layers of a model with its
    vocabulary."""
    outside = [layer for layer in drafter.target_layers if not 0 <= layer < layers]
    if outside:
        raise DrafterMismatch(
            f"the {drafter.kind.api_name} drafter reads layers {outside}, the model has main"
            f" layers 0..{layers - 1}"
        )
    if drafter.vocab_size != vocab:
        raise DrafterMismatch(
            f"the {drafter.kind.api_name} drafter's vocabulary has {drafter.vocab_size} tokens, "
            f"the model's {vocab}"
        )


def describe_drafter(drafter: DrafterFacts) -> str:
    """One line for people: what it is, what it reads, its vocabulary and bytes."""
    where = f" in {drafter.file}" if drafter.file else ""
    unit = "stage" if drafter.kind is DrafterKind.DSPARK else "block"
    layers = ", ".join(str(layer) for layer in drafter.target_layers)
    reduced = (f" (drafts over {drafter.draft_vocab})"
               if drafter.draft_vocab != drafter.vocab_size else "")
    return (
        f"{drafter.kind.api_name}{where}, "
        f"{drafter.blocks} {unit}{'s' if drafter.blocks != 1 else ''} "
        f"reading main layer{'s' if len(drafter.target_layers) != 1 else ''} {layers}, "
        f"{drafter.block_size} token{'s' if drafter.block_size != 1 else ''} per pass, "
        f"vocabulary {drafter.vocab_size}{reduced}, {drafter.total_bytes:,} bytes"
    )
