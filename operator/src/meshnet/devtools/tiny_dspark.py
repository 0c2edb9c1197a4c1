"""Tiny random-weight DSpark drafters (`dflash` GGUFs with a DeepSeek V4 backbone) for a tiny
deepseek4 target: what the pinned llama.cpp's `dflash` loader asks for, deterministic from a
seed (the same seed writes the same bytes).

A DSpark drafter reads the hidden states of a few target layers (`dflash.target_layers`),
fuses them (`fc`, `enc.output_norm`) into the keys of its own stages (full V4 blocks, all
uncompressed sliding-window attention), drafts a block of `dflash.block_size` tokens in one
pass and chains them with a Markov head (`markov_w1`, `markov_w2`). Like the published V4
drafter it borrows the target's token embeddings and output head (llama.cpp reaches them
through the target's context), so its vocabulary is the target's: no reduced draft
vocabulary (`d2t`), which the pinned V4 drafting graph does not apply."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFWriter

from meshnet.devtools.tiny_deepseek4 import (
    HC_MULT,
    SMALL,
    TinyDeepseek4,
    Weights,
    add_vocabulary,
    layer_tensors,
    write_block_keys,
)

ARCH = "dflash"
MASK_TOKEN_ID = 0  # the noise token of the drafted positions: <unk>, never sampled as text


@dataclass(frozen=True)
class TinyDSpark:
    """The drafter's own shape; its widths come from the target."""

    stages: int = 3  # V4-Flash's DSpark has 3
    block_size: int = 5  # tokens per drafted block, the anchor first
    markov_rank: int = 32
    # the target's main layers whose outputs it reads; () = the last `stages` main layers
    tapped_layers: tuple[int, ...] = ()
    expert_type: str = "q8_0"  # the stages' routed and shared experts

    def tapped(self, target: TinyDeepseek4) -> tuple[int, ...]:
        return self.tapped_layers or tuple(range(target.n_layer - self.stages, target.n_layer))


DSPARK = TinyDSpark()


def _keys(writer: GGUFWriter, d: TinyDSpark, m: TinyDeepseek4, tapped: Sequence[int]) -> None:
    k = f"{ARCH}."
    writer.add_string("general.name", f"tiny-dspark-{d.stages}S-for-{m.n_layer}L")
    writer.add_uint32(k + "context_length", m.context_length)
    writer.add_uint32(k + "embedding_length", m.n_embd)
    writer.add_uint32(k + "block_count", d.stages)
    write_block_keys(writer, k, m, d.stages)
    writer.add_array(k + "attention.compress_ratios", [0] * d.stages)
    writer.add_uint32(k + "rope.dimension_count", m.n_rot)
    writer.add_float32(k + "rope.freq_base", 10000.0)
    writer.add_uint32(k + "hyper_connection.count", HC_MULT)
    writer.add_uint32(k + "hyper_connection.sinkhorn_iterations", 20)
    writer.add_float32(k + "hyper_connection.epsilon", 1e-6)
    writer.add_uint32(k + "block_size", d.block_size)
    # llama.cpp's index of a layer's *input*: the output of main layer i is entry i + 1
    writer.add_array(k + "target_layers", [layer + 1 for layer in tapped])
    writer.add_uint32("tokenizer.ggml.mask_token_id", MASK_TOKEN_ID)


def _check(d: TinyDSpark, target: TinyDeepseek4, tapped: Sequence[int]) -> None:
    if d.stages < 1 or d.block_size < 2 or d.markov_rank < 1:
        raise ValueError("a drafter needs at least one stage, a block of 2 and a Markov rank")
    if not tapped or any(not 0 <= layer < target.n_layer for layer in tapped):
        raise ValueError(f"tapped layers {list(tapped)}: main layers of the target are "
                         f"0..{target.n_layer - 1}")
    if d.expert_type != "f32" and (target.n_embd % 32 or target.expert_ff % 32):
        raise ValueError("quantized experts need n_embd and the expert width to be multiples of 32")


def write_tiny_dspark(path: Path, target: TinyDeepseek4 = SMALL, drafter: TinyDSpark = DSPARK,
                      seed: int = 0) -> Path:
    """Write a drafter for `target` (same vocabulary, widths and hyper-connections) with
    weights drawn from `seed`; ValueError for a shape the loader or the target would refuse."""
    tapped = drafter.tapped(target)
    _check(drafter, target, tapped)
    n, hc, rank = target.n_embd, HC_MULT, drafter.markov_rank
    writer = GGUFWriter(path, ARCH)
    _keys(writer, drafter, target, tapped)
    n_vocab = add_vocabulary(writer)

    w = Weights(writer, seed)
    w.matrix("fc.weight", [len(tapped) * n, n])
    w.norm("enc.output_norm.weight", n)
    stage = dataclasses.replace(target, n_layer=drafter.stages, hash_layers=0,
                                compress_ratios=(0,) * drafter.stages,
                                expert_type=drafter.expert_type)
    for il in range(drafter.stages):
        layer_tensors(w, stage, il, 0, n_vocab)
    w.matrix("output_hc_fn.weight", [hc * n, hc])
    w.small("output_hc_base.weight", [hc])
    w.small("output_hc_scale.weight", [1])
    w.norm("output_norm.weight", n)
    w.matrix("markov_w1.weight", [rank, n_vocab])
    w.matrix("markov_w2.weight", [rank, n_vocab])

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
