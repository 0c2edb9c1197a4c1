"""GGUF facts and stage footprints: SmolLM2 (dense) and a tiny deepseek4-shaped GGUF (mHC)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from meshnet.artifacts.facts import DENSE_RESIDUAL, MHC_RESIDUAL, model_facts, stage_footprint
from meshnet.artifacts.gguf_header import read_header
from meshnet.artifacts.splitset import order_split_set


@pytest.fixture(scope="module")
def smollm2_facts(split_set):
    return model_facts(order_split_set([read_header(p) for p in split_set.files]))


def test_smollm2_is_a_dense_llama_of_30_layers_with_576_wide_boundaries(smollm2_facts):
    facts = smollm2_facts

    assert (facts.architecture, facts.block_count, facts.layers) == ("llama", 30, 30)
    assert facts.embedding_length == 576
    assert (facts.boundary.schema, facts.boundary.shape) == (DENSE_RESIDUAL, (576,))
    assert not facts.boundary.token_ids
    assert len(facts.layer_bytes) == 30 and len(set(facts.layer_bytes)) == 1
    assert facts.tied_output  # SmolLM2 reuses the token embeddings as its output head


def test_the_whole_range_loads_every_tensor(smollm2_facts, split_set):
    facts = smollm2_facts

    assert stage_footprint(facts, 0, 30) == facts.total_bytes
    assert facts.total_bytes < split_set.total  # headers and padding are not tensors


def test_stage_footprints_split_the_layers_and_the_tied_head_needs_the_embeddings(smollm2_facts):
    facts = smollm2_facts
    first, middle, last = (stage_footprint(facts, 0, 10), stage_footprint(facts, 10, 20),
                           stage_footprint(facts, 20, 30))

    assert middle == 10 * facts.layer_bytes[0] + facts.shared_bytes
    assert first == middle + facts.input_bytes
    assert last == middle + facts.input_bytes + facts.head_bytes
    assert first + middle + last == facts.total_bytes + facts.input_bytes + 2 * facts.shared_bytes


@pytest.mark.parametrize("begin,end", [(5, 5), (-1, 3), (0, 31), (20, 10)])
def test_a_range_outside_the_layers_is_refused(smollm2_facts, begin, end):
    with pytest.raises(ValueError, match="not within"):
        stage_footprint(smollm2_facts, begin, end)


def write_tiny_deepseek4(path):
    """A random-weight GGUF with deepseek4's keys: 4 main layers + 1 MTP block, hc_mult 4."""
    writer = gguf.GGUFWriter(path, "deepseek4")
    writer.add_block_count(5)
    writer.add_uint32("deepseek4.nextn_predict_layers", 1)
    writer.add_embedding_length(64)
    writer.add_uint32("deepseek4.hyper_connection.count", 4)
    writer.add_uint32("deepseek4.hash_layer_count", 3)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.random((100, 64), dtype=np.float32))
    for layer in range(5):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", rng.random(64, dtype=np.float32))
        writer.add_tensor(f"blk.{layer}.ffn_up.weight", rng.random((32, 64), dtype=np.float32))
    writer.add_tensor("output_norm.weight", rng.random(64, dtype=np.float32))
    writer.add_tensor("output.weight", rng.random((100, 64), dtype=np.float32))
    writer.add_tensor("output_hc_fn.weight", rng.random((4, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_deepseek4_model_has_an_mhc_boundary_with_token_ids_and_reserved_mtp(tmp_path):
    path = tmp_path / "tiny-deepseek4.gguf"
    write_tiny_deepseek4(path)

    facts = model_facts(order_split_set([read_header(path)]))

    assert (facts.architecture, facts.block_count, facts.layers) == ("deepseek4", 5, 4)
    assert (facts.boundary.schema, facts.boundary.shape) == (MHC_RESIDUAL, (4, 64))
    assert facts.boundary.token_ids
    layer = 64 * 4 + 32 * 64 * 4
    assert facts.layer_bytes == (layer,) * 4
    assert facts.mtp_bytes == layer  # never part of a stage while MTP is off
    assert not facts.tied_output
    assert stage_footprint(facts, 2, 4) == 2 * layer + facts.head_bytes
    assert facts.head_bytes == 64 * 4 + 100 * 64 * 4 + 4 * 256 * 4
