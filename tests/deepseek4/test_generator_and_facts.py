"""The tiny deepseek4 generator writes what the pinned loader reads, deterministically, and
the artifact tools read deepseek4's facts from its header: mHC boundary, hash layers, and
stage footprints that add up to the model."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType, GGUFReader

from meshnet.artifacts.facts import MHC_RESIDUAL, model_facts, stage_footprint
from meshnet.artifacts.gguf_header import read_header
from meshnet.artifacts.splitset import order_split_set
from meshnet.devtools.tiny_deepseek4 import (
    SMALL,
    V4_DEPTH,
    V4_FLASH_INDEXER_TOP_K,
    v4_compress_ratios,
    write_tiny_deepseek4,
)
from meshnet.reconcile.artifact.status import gguf_facts


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_weights(tmp_path: Path) -> None:
    a = write_tiny_deepseek4(tmp_path / "a.gguf", SMALL, seed=7)
    b = write_tiny_deepseek4(tmp_path / "b.gguf", SMALL, seed=7)
    c = write_tiny_deepseek4(tmp_path / "c.gguf", SMALL, seed=8)
    assert digest(a) == digest(b) != digest(c)


def test_the_v4_depth_model_has_v4s_layer_pattern(ds4_v4: Path) -> None:
    reader = GGUFReader(ds4_v4)
    ratios = [int(v) for v in reader.fields["deepseek4.attention.compress_ratios"].contents()]
    assert ratios == list(v4_compress_ratios(43))
    assert len(ratios) == 43 and set(ratios) == {0, 4, 128}
    assert ratios[:2] == [0, 0] and ratios[-1] == 0
    assert int(reader.fields["deepseek4.hash_layer_count"].contents()) == 3
    names = {t.name for t in reader.tensors}
    assert {f"blk.{i}.ffn_gate_tid2eid.weight" for i in range(3)} <= names
    assert "blk.3.ffn_gate_tid2eid.weight" not in names
    assert "blk.3.exp_probs_b.bias" in names and "blk.2.exp_probs_b.bias" not in names
    indexer_layers = {i for i, r in enumerate(ratios) if r == 4}
    assert {int(n.split(".")[1]) for n in names if ".indexer.proj." in n} == indexer_layers


def test_a_quantized_variant_writes_q8_0_experts(ds4_small_q8: Path) -> None:
    types = {t.name: t.tensor_type for t in GGUFReader(ds4_small_q8).tensors}
    assert types["blk.0.ffn_up_exps.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.ffn_down_shexp.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_q_a.weight"] == GGMLQuantizationType.F32
    assert types["blk.0.ffn_gate_tid2eid.weight"] == GGMLQuantizationType.I32


def test_shapes_the_loader_would_refuse_are_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compress ratios"):
        write_tiny_deepseek4(tmp_path / "x.gguf",
                             dataclasses.replace(SMALL, compress_ratios=(8,) * 8))
    with pytest.raises(ValueError, match="rotary"):
        write_tiny_deepseek4(tmp_path / "x.gguf", dataclasses.replace(SMALL, indexer_dim=16))
    assert not (tmp_path / "x.gguf").exists()


def test_the_header_facts_of_a_deepseek4_model(ds4_v4: Path) -> None:
    facts = model_facts(order_split_set([read_header(ds4_v4)]))
    assert (facts.architecture, facts.block_count, facts.layers) == ("deepseek4", 43, 43)
    assert facts.embedding_length == V4_DEPTH.n_embd
    assert (facts.boundary.schema, facts.boundary.shape) == (MHC_RESIDUAL, (4, V4_DEPTH.n_embd))
    assert facts.boundary.token_ids and facts.boundary.hash_layers == 3
    assert facts.shared_bytes == 0  # the mHC head belongs to the last stage, not to every one
    split = [(0, 3), (3, 20), (20, 43)]
    assert sum(stage_footprint(facts, b, e) for b, e in split) == facts.total_bytes
    status = gguf_facts({"gguf": facts.to_json()})
    assert status is not None
    assert (status.boundary_schema, status.boundary_shape, status.hash_layer_count) == (
        MHC_RESIDUAL, [4, V4_DEPTH.n_embd], 3)


def test_the_devtools_command_writes_a_model_and_refuses_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    proc = subprocess.run([sys.executable, "-m", "meshnet.devtools", "tiny-deepseek4", str(out),
                           "--layers", "5", "--experts", "q8_0", "--seed", "3",
                           "--indexer-top-k", str(V4_FLASH_INDEXER_TOP_K)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "deepseek4, 5 layers" in proc.stdout
    assert model_facts(order_split_set([read_header(out)])).layers == 5
    top_k = GGUFReader(out).fields["deepseek4.attention.indexer.top_k"].contents()
    assert int(top_k) == V4_FLASH_INDEXER_TOP_K == 512
    bad = subprocess.run([sys.executable, "-m", "meshnet.devtools", "tiny-deepseek4",
                          str(tmp_path / "n.gguf"), "--embd", "48", "--experts", "q8_0"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2
    assert "multiples of 32" in bad.stderr
