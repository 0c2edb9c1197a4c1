"""Tiny random-weight DeepSeek V4 (`deepseek4`) GGUFs for tests: every tensor and key the
pinned llama.cpp's loader asks for, at widths small enough to run on a CPU in milliseconds,
deterministic from a seed (the same seed writes the same bytes).

Two shapes matter to the tests: a small model (8 layers) for fast checks, and one with V4's
real depth and pattern (43 layers, the first 3 hash-routed, sliding-window, CSA and HCA
layers across the depth). Either may carry an MTP block after its main layers, drawn from
its own random stream so that the main weights are the same bytes with or without it. The
PyPI `gguf` package has no deepseek4 helpers, so the keys are written by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize

ARCH = "deepseek4"
HC_MULT = 4  # hyper-connection streams; the loader asserts 4
GATING_SQRT_SOFTPLUS = 4  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS
QUANT_TYPES = {"f32": GGMLQuantizationType.F32, "q8_0": GGMLQuantizationType.Q8_0}


def v4_compress_ratios(n_layer: int) -> tuple[int, ...]:
    """Sliding-window only at both ends, CSA (4) and HCA (128) alternating between them:
    so a stage at either end can hold no compressed layer, and a one-layer stage of a
    ratio-128 layer holds no indexer."""
    if n_layer < 4:
        return (0,) * n_layer
    middle = tuple(4 if i % 2 == 0 else 128 for i in range(n_layer - 3))
    return (0, 0, *middle, 0)


@dataclass(frozen=True)
class TinyDeepseek4:
    """The model's shape. Head width must equal the key/value length (one shared K=V head)."""

    n_layer: int = 8
    n_embd: int = 64
    n_head: int = 4
    head_dim: int = 64
    n_rot: int = 32
    q_lora_rank: int = 64
    o_groups: int = 2
    o_lora_rank: int = 32
    n_expert: int = 4
    n_expert_used: int = 2
    n_expert_shared: int = 1
    expert_ff: int = 64
    indexer_heads: int = 4
    indexer_dim: int = 64
    # compressed rows the indexer keeps per query; it selects only past 4 x top-k positions
    indexer_top_k: int = 2048
    sliding_window: int = 16
    hash_layers: int = 3
    context_length: int = 4096
    compress_ratios: tuple[int, ...] = field(default=())
    expert_type: str = "f32"  # f32 | q8_0: the routed and shared experts' tensor type
    # MTP (`nextn`) blocks after the main layers; the pinned MTP graph runs exactly one
    mtp_layers: int = 0

    def ratios(self) -> tuple[int, ...]:
        """One per main layer; MTP blocks attend uncompressed (ratio 0)."""
        return self.compress_ratios or v4_compress_ratios(self.n_layer)

    @property
    def block_count(self) -> int:
        return self.n_layer + self.mtp_layers


SMALL = TinyDeepseek4(n_layer=8)
V4_DEPTH = TinyDeepseek4(n_layer=43)
# V4's boundary on the wire (n_embd 4096 x mHC 4: 64 KiB a row in f32) with few, small
# layers: what a leg's bandwidth sees, at a tiny compute.
V4_WIDTH = TinyDeepseek4(n_layer=4, n_embd=4096)
# V4-Flash's index_topk (its config.json; the pinned convert script writes it unchanged as
# deepseek4.attention.indexer.top_k): with it the indexer selects past 2048 positions.
V4_FLASH_INDEXER_TOP_K = 512


# --- vocabulary ------------------------------------------------------------------------------

# A SentencePiece vocabulary with byte fallback for ASCII: any ASCII text tokenizes, and any
# sequence of ids detokenizes to valid UTF-8 (a random model samples arbitrary ids).
SPECIALS = ("<unk>", "<s>", "</s>")
PIECES = (
    "▁", "▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it", "▁that", "▁for", "▁on",
    "▁was", "▁with", "▁as", "▁map", "▁world", "▁story", "▁people", "▁sea", "▁coast", "▁line",
    "▁chart", "▁Hello", "▁hello", "▁code", "▁def", "▁return", "er", "ed", "ing", "es", "ly",
    "th", "he", "an", "re", "on", "at", "en", "nd", "ou", "st", "ar",
)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = [*SPECIALS, *(f"<0x{b:02X}>" for b in range(128)), *PIECES]
    scores = [0.0] * (len(SPECIALS) + 128) + [-float(i + 1) for i in range(len(PIECES))]
    types = ([TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
             + [TokenType.BYTE] * 128 + [TokenType.NORMAL] * len(PIECES))
    return tokens, scores, [int(t) for t in types]


def add_vocabulary(writer: GGUFWriter) -> int:
    """The tokenizer keys; returns the vocabulary size."""
    tokens, scores, types = vocabulary()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    return len(tokens)


# --- weights ---------------------------------------------------------------------------------


class Weights:
    """Random tensors in ggml's shape order (ne0 first), written as numpy's reverse. Each
    `stream` of a seed is its own sequence: adding tensors drawn from one stream leaves the
    bytes of the others unchanged."""

    def __init__(self, writer: GGUFWriter, seed: int, stream: int = 0) -> None:
        self.writer = writer
        self.rng = np.random.default_rng([seed, stream] if stream else seed)

    def matrix(self, name: str, ne: Sequence[int], qtype: str = "f32") -> None:
        fan_in = ne[0]
        data = self.rng.standard_normal(tuple(reversed(ne))).astype(np.float32)
        self._add(name, data / np.float32(np.sqrt(fan_in)), qtype)

    def small(self, name: str, ne: Sequence[int], scale: float = 0.1) -> None:
        data = self.rng.standard_normal(tuple(reversed(ne))).astype(np.float32)
        self._add(name, data * np.float32(scale), "f32")

    def norm(self, name: str, n: int) -> None:
        data = 1.0 + 0.1 * self.rng.standard_normal(n).astype(np.float32)
        self._add(name, data.astype(np.float32), "f32")

    def hash_table(self, name: str, n_vocab: int, n_used: int, n_expert: int) -> None:
        """{n_used, n_vocab} I32: distinct experts for each token id."""
        rows = [self.rng.permutation(n_expert)[:n_used] for _ in range(n_vocab)]
        self.writer.add_tensor(name, np.asarray(rows, dtype=np.int32))

    def _add(self, name: str, data: np.ndarray, qtype: str) -> None:
        kind = QUANT_TYPES[qtype]
        if kind == GGMLQuantizationType.F32:
            self.writer.add_tensor(name, data)
        else:
            self.writer.add_tensor(name, quantize(data, kind), raw_dtype=kind)


def layer_tensors(w: Weights, m: TinyDeepseek4, il: int, ratio: int, n_vocab: int) -> None:
    n, hd, mix = m.n_embd, m.head_dim, (2 + HC_MULT) * HC_MULT
    blk = f"blk.{il}"
    w.norm(f"{blk}.attn_norm.weight", n)
    w.small(f"{blk}.attn_sinks.weight", [m.n_head])
    w.matrix(f"{blk}.attn_q_a.weight", [n, m.q_lora_rank])
    w.norm(f"{blk}.attn_q_a_norm.weight", m.q_lora_rank)
    w.matrix(f"{blk}.attn_q_b.weight", [m.q_lora_rank, m.n_head * hd])
    w.matrix(f"{blk}.attn_kv.weight", [n, hd])
    w.norm(f"{blk}.attn_kv_a_norm.weight", hd)
    w.matrix(f"{blk}.attn_output_a.weight",
             [m.n_head * hd // m.o_groups, m.o_lora_rank * m.o_groups])
    w.matrix(f"{blk}.attn_output_b.weight", [m.o_groups * m.o_lora_rank, n])
    for part in ("attn", "ffn"):
        w.matrix(f"{blk}.hc_{part}_fn.weight", [HC_MULT * n, mix])
        w.small(f"{blk}.hc_{part}_base.weight", [mix])
        w.small(f"{blk}.hc_{part}_scale.weight", [3])
    if ratio:
        width = (2 if ratio == 4 else 1) * hd
        w.matrix(f"{blk}.attn_compressor_kv.weight", [n, width])
        w.matrix(f"{blk}.attn_compressor_gate.weight", [n, width])
        w.small(f"{blk}.attn_compressor_ape.weight", [width, ratio])
        w.norm(f"{blk}.attn_compressor_norm.weight", hd)
    if ratio == 4:
        idx = m.indexer_dim
        w.matrix(f"{blk}.indexer.proj.weight", [n, m.indexer_heads])
        w.matrix(f"{blk}.indexer.attn_q_b.weight", [m.q_lora_rank, m.indexer_heads * idx])
        w.matrix(f"{blk}.indexer_compressor_kv.weight", [n, 2 * idx])
        w.matrix(f"{blk}.indexer_compressor_gate.weight", [n, 2 * idx])
        w.small(f"{blk}.indexer_compressor_ape.weight", [2 * idx, 4])
        w.norm(f"{blk}.indexer_compressor_norm.weight", idx)
    w.matrix(f"{blk}.ffn_gate_inp.weight", [n, m.n_expert])
    if il < m.hash_layers:
        w.hash_table(f"{blk}.ffn_gate_tid2eid.weight", n_vocab, m.n_expert_used, m.n_expert)
    else:
        w.small(f"{blk}.exp_probs_b.bias", [m.n_expert])
    w.norm(f"{blk}.ffn_norm.weight", n)
    ff, shared = m.expert_ff, m.expert_ff * m.n_expert_shared
    w.matrix(f"{blk}.ffn_gate_exps.weight", [n, ff, m.n_expert], m.expert_type)
    w.matrix(f"{blk}.ffn_up_exps.weight", [n, ff, m.n_expert], m.expert_type)
    w.matrix(f"{blk}.ffn_down_exps.weight", [ff, n, m.n_expert], m.expert_type)
    w.matrix(f"{blk}.ffn_gate_shexp.weight", [n, shared], m.expert_type)
    w.matrix(f"{blk}.ffn_up_shexp.weight", [n, shared], m.expert_type)
    w.matrix(f"{blk}.ffn_down_shexp.weight", [shared, n], m.expert_type)


def _mtp_block(w: Weights, m: TinyDeepseek4, il: int, n_vocab: int) -> None:
    """A full uncompressed layer plus the `nextn` projection that mixes the token's embedding
    into the main model's last hidden state; the embeddings and head are the model's own."""
    layer_tensors(w, m, il, 0, n_vocab)
    blk = f"blk.{il}.nextn"
    w.matrix(f"{blk}.eh_proj.weight", [2 * m.n_embd, m.n_embd], "q8_0")  # Q8_0 as converted
    w.norm(f"{blk}.enorm.weight", m.n_embd)
    w.norm(f"{blk}.hnorm.weight", m.n_embd)
    w.norm(f"{blk}.shared_head_norm.weight", m.n_embd)


def write_block_keys(writer: GGUFWriter, k: str, m: TinyDeepseek4, blocks: int) -> None:
    """The keys of V4's blocks (experts, attention) under prefix `k`, for `blocks` blocks:
    the model's and its DSpark drafter's (whose stages are V4 blocks of the same widths)."""
    writer.add_uint32(k + "expert_count", m.n_expert)
    writer.add_uint32(k + "expert_used_count", m.n_expert_used)
    writer.add_uint32(k + "expert_feed_forward_length", m.expert_ff)
    writer.add_uint32(k + "expert_shared_count", m.n_expert_shared)
    writer.add_float32(k + "expert_weights_scale", 1.5)
    writer.add_bool(k + "expert_weights_norm", True)
    writer.add_uint32(k + "expert_gating_func", GATING_SQRT_SOFTPLUS)
    writer.add_array(k + "swiglu_clamp_exp", [10.0] * blocks)
    writer.add_array(k + "swiglu_clamp_shexp", [10.0] * blocks)
    writer.add_uint32(k + "attention.head_count", m.n_head)
    writer.add_uint32(k + "attention.head_count_kv", 1)
    writer.add_uint32(k + "attention.key_length", m.head_dim)
    writer.add_uint32(k + "attention.value_length", m.head_dim)
    writer.add_float32(k + "attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_uint32(k + "attention.q_lora_rank", m.q_lora_rank)
    writer.add_uint32(k + "attention.sliding_window", m.sliding_window)
    writer.add_uint32(k + "attention.output_group_count", m.o_groups)
    writer.add_uint32(k + "attention.output_lora_rank", m.o_lora_rank)


def _keys(writer: GGUFWriter, m: TinyDeepseek4) -> None:
    k = f"{ARCH}."
    suffix = f"-mtp{m.mtp_layers}" if m.mtp_layers else ""
    writer.add_string("general.name", f"tiny-deepseek4-{m.n_layer}L{suffix}")
    writer.add_uint32(k + "context_length", m.context_length)
    writer.add_uint32(k + "embedding_length", m.n_embd)
    writer.add_uint32(k + "embedding_length_out", HC_MULT * m.n_embd)
    writer.add_uint32(k + "block_count", m.block_count)
    if m.mtp_layers:
        writer.add_uint32(k + "nextn_predict_layers", m.mtp_layers)
    write_block_keys(writer, k, m, m.block_count)
    writer.add_float32(k + "attention.compress_rope_freq_base", 160000.0)
    writer.add_array(k + "attention.compress_ratios", [*m.ratios(), *(0,) * m.mtp_layers])
    writer.add_uint32(k + "attention.indexer.head_count", m.indexer_heads)
    writer.add_uint32(k + "attention.indexer.key_length", m.indexer_dim)
    writer.add_uint32(k + "attention.indexer.top_k", m.indexer_top_k)
    writer.add_uint32(k + "rope.dimension_count", m.n_rot)
    writer.add_float32(k + "rope.freq_base", 10000.0)
    writer.add_uint32(k + "hyper_connection.count", HC_MULT)
    writer.add_uint32(k + "hyper_connection.sinkhorn_iterations", 20)
    writer.add_float32(k + "hyper_connection.epsilon", 1e-6)
    writer.add_uint32(k + "hash_layer_count", m.hash_layers)


def write_tiny_deepseek4(path: Path, model: TinyDeepseek4 = SMALL, seed: int = 0) -> Path:
    """Write `model` with weights drawn from `seed` to `path`; ValueError for a shape the
    loader would refuse."""
    ratios = model.ratios()
    if len(ratios) != model.n_layer or any(r not in (0, 4, 128) for r in ratios):
        raise ValueError(f"compress ratios {ratios}: one of 0, 4, 128 per layer")
    if model.hash_layers > model.n_layer or model.n_head % model.o_groups:
        raise ValueError("hash layers exceed the depth, or heads are not a multiple of groups")
    if model.indexer_dim < model.n_rot:
        raise ValueError("the indexer's key length must be at least the rotary dimensions")
    if model.expert_type != "f32" and (model.n_embd % 32 or model.expert_ff % 32):
        raise ValueError("quantized experts need n_embd and the expert width to be multiples of 32")
    if model.mtp_layers not in (0, 1):
        raise ValueError(f"{model.mtp_layers} MTP blocks: the pinned MTP graph runs exactly one")
    writer = GGUFWriter(path, ARCH)
    _keys(writer, model)
    n_vocab = add_vocabulary(writer)

    weights = Weights(writer, seed)
    n, hc = model.n_embd, HC_MULT
    weights.matrix("token_embd.weight", [n, n_vocab])
    for il, ratio in enumerate(ratios):
        layer_tensors(weights, model, il, ratio, n_vocab)
    mtp_weights = Weights(writer, seed, stream=1)
    for il in range(model.n_layer, model.block_count):
        _mtp_block(mtp_weights, model, il, n_vocab)
    weights.matrix("output_hc_fn.weight", [hc * n, hc])
    weights.small("output_hc_base.weight", [hc])
    weights.small("output_hc_scale.weight", [1])
    weights.norm("output_norm.weight", n)
    weights.matrix("output.weight", [n, n_vocab])

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
