"""The drafter test models: a tiny deepseek4 with an MTP block and a tiny DSpark drafter GGUF
are deterministic, carry what the pinned loaders read, load there (the MTP model through our
worker and reference tool, the drafter through llama.cpp's own loader) and draft in the
pin's own draft paths, and the artifact facts and `meshnet artifact manifest` report the
drafter or refuse one that does not fit."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gguf import GGMLQuantizationType, GGUFReader

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.shardroute import LayerRange
from meshnet.artifacts.facts import artifact_facts, stage_footprint
from meshnet.artifacts.gguf_header import read_header
from meshnet.devtools.pinned_draft import build_speculative_example, run_draft
from meshnet.devtools.tiny_deepseek4 import SMALL, vocabulary, write_tiny_deepseek4
from meshnet.devtools.tiny_dspark import DSPARK as TINY_DSPARK
from meshnet.devtools.tiny_dspark import write_tiny_dspark
from meshnet.errors import DrafterMismatch, IncompleteSplitSet
from meshnet.local.process import LaunchSpec, start_route
from meshnet.paths import workspace
from meshnet.route import RouteDriver, StageClient
from meshnet.unsplit import unsplit_tokens

PROMPT_TOKENS = [1, 20, 30, 40, 50, 60, 70]
N_VOCAB = len(vocabulary()[0])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensors(path: Path) -> dict[str, bytes]:
    return {t.name: bytes(t.data.tobytes()) for t in GGUFReader(path).tensors}


# --- the generators ----------------------------------------------------------------------------


def test_the_same_seed_writes_the_same_drafters_and_another_seed_other_weights(
    tmp_path: Path,
) -> None:
    mtp = dataclasses.replace(SMALL, mtp_layers=1)
    a, b, c = (write_tiny_deepseek4(tmp_path / f"m{i}.gguf", mtp, seed=s)
               for i, s in enumerate((5, 5, 6)))
    assert digest(a) == digest(b) != digest(c)
    d, e, f = (write_tiny_dspark(tmp_path / f"d{i}.gguf", SMALL, TINY_DSPARK, seed=s)
               for i, s in enumerate((5, 5, 6)))
    assert digest(d) == digest(e) != digest(f)


def test_an_mtp_block_follows_the_main_layers_and_leaves_their_weights_unchanged(
    ds4_small: Path, ds4_small_mtp: Path,
) -> None:
    reader = GGUFReader(ds4_small_mtp)
    field = reader.fields
    assert int(field["deepseek4.block_count"].contents()) == 9
    assert int(field["deepseek4.nextn_predict_layers"].contents()) == 1
    # arrays the loader reads per block cover the MTP block too; it attends uncompressed
    assert list(field["deepseek4.attention.compress_ratios"].contents()) == [
        0, 0, 4, 128, 4, 128, 4, 0, 0]
    assert len(field["deepseek4.swiglu_clamp_exp"].contents()) == 9
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.8.nextn.eh_proj.weight"] == GGMLQuantizationType.Q8_0
    assert {"blk.8.nextn.enorm.weight", "blk.8.nextn.hnorm.weight", "blk.8.attn_kv.weight",
            "blk.8.exp_probs_b.bias"} <= types.keys()
    assert "blk.8.ffn_gate_tid2eid.weight" not in types  # the MTP graph refuses hash routing

    plain, with_mtp = tensors(ds4_small), tensors(ds4_small_mtp)
    assert all(with_mtp[name] == data for name, data in plain.items())
    assert {n.split(".")[1] for n in with_mtp.keys() - plain.keys()} == {"8"}


def test_the_drafter_carries_what_the_dflash_loader_reads(ds4_small: Path,
                                                          ds4_dspark: Path) -> None:
    reader = GGUFReader(ds4_dspark)
    field = reader.fields
    assert str(field["general.architecture"].contents()) == "dflash"
    # llama.cpp numbers layer inputs: the outputs of layers 5, 6 and 7 are entries 6, 7, 8
    assert list(field["dflash.target_layers"].contents()) == [6, 7, 8]
    assert int(field["dflash.block_size"].contents()) == 5
    assert int(field["dflash.block_count"].contents()) == 3
    assert int(field["dflash.hyper_connection.count"].contents()) == 4
    assert list(field["dflash.attention.compress_ratios"].contents()) == [0, 0, 0]
    assert field["tokenizer.ggml.tokens"].contents() == (
        GGUFReader(ds4_small).fields["tokenizer.ggml.tokens"].contents())
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert shapes["fc.weight"] == [3 * SMALL.n_embd, SMALL.n_embd]
    assert shapes["markov_w1.weight"] == shapes["markov_w2.weight"] == [32, N_VOCAB]
    assert {"enc.output_norm.weight", "output_norm.weight", "output_hc_fn.weight"} <= shapes.keys()
    assert types["blk.2.ffn_up_exps.weight"] == GGMLQuantizationType.Q8_0
    # the target's embeddings and head serve it, as in the published V4 drafter
    assert "token_embd.weight" not in shapes and "output.weight" not in shapes


def test_a_drafter_reading_layers_the_target_lacks_is_refused_before_writing(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match=r"main layers of the target are 0\.\.7"):
        write_tiny_dspark(tmp_path / "x.gguf", SMALL,
                          dataclasses.replace(TINY_DSPARK, tapped_layers=(6, 7, 8)))
    with pytest.raises(ValueError, match="exactly one"):
        write_tiny_deepseek4(tmp_path / "x.gguf", dataclasses.replace(SMALL, mtp_layers=2))
    assert not (tmp_path / "x.gguf").exists()


def test_the_devtools_commands_write_both_and_say_what(tmp_path: Path) -> None:
    def devtools(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "meshnet.devtools", *args],
                              capture_output=True, text=True, timeout=120, check=False)

    target = devtools("tiny-deepseek4", str(tmp_path / "t.gguf"), "--layers", "6",
                      "--mtp-layers", "1", "--seed", "2")
    assert target.returncode == 0, target.stderr
    assert "6 layers + 1 MTP" in target.stdout
    drafter = devtools("tiny-dspark", str(tmp_path / "d.gguf"), "--target-layers", "6",
                       "--tapped", "3,5", "--stages", "2", "--block-size", "4")
    assert drafter.returncode == 0, drafter.stderr
    assert "reading target layers 3, 5" in drafter.stdout
    facts = artifact_facts([read_header(tmp_path / "t.gguf"), read_header(tmp_path / "d.gguf")])
    assert facts.drafter is not None
    assert (facts.drafter.target_layers, facts.drafter.blocks, facts.drafter.block_size) == (
        (3, 5), 2, 4)
    bad = devtools("tiny-dspark", str(tmp_path / "n.gguf"), "--tapped", "5,x")
    assert bad.returncode == 2 and "expected layer numbers" in bad.stderr


# --- the facts -------------------------------------------------------------------------------


def test_the_facts_report_the_models_own_mtp_block(ds4_small_mtp: Path) -> None:
    facts = artifact_facts([read_header(ds4_small_mtp)])
    assert (facts.block_count, facts.layers, facts.vocab_size) == (9, 8, N_VOCAB)
    drafter = facts.drafter
    assert drafter is not None and drafter.kind is DrafterKind.MTP
    assert (drafter.blocks, drafter.target_layers, drafter.block_size) == (1, (7,), 1)
    assert drafter.total_bytes == facts.mtp_bytes > 0
    assert stage_footprint(facts, 0, 8) == facts.total_bytes - facts.mtp_bytes
    assert facts.to_json()["drafter"]["kind"] == "MTP"


def test_the_facts_report_a_dspark_drafter_beside_the_model(ds4_small: Path,
                                                           ds4_dspark: Path) -> None:
    facts = artifact_facts([read_header(ds4_dspark), read_header(ds4_small)])
    drafter = facts.drafter
    assert drafter is not None and drafter.kind is DrafterKind.DSPARK
    assert (drafter.blocks, drafter.target_layers, drafter.block_size) == (3, (5, 6, 7), 5)
    assert drafter.vocab_size == drafter.draft_vocab == facts.vocab_size == N_VOCAB
    assert drafter.file == ds4_dspark.name
    assert drafter.total_bytes == sum(read_header(ds4_dspark).tensor_bytes.values())
    # the drafter is no stage's weight: the stages add up to the model alone
    assert stage_footprint(facts, 0, 4) + stage_footprint(facts, 4, 8) == facts.total_bytes
    assert facts.to_json()["drafter"]["targetLayers"] == [5, 6, 7]


def test_a_reduced_draft_vocabulary_is_reported(ds4_small: Path, ds4_dspark: Path) -> None:
    header = read_header(ds4_dspark)
    reduced = dataclasses.replace(header, tensor_bytes={**header.tensor_bytes, "d2t": 8 * 100})
    facts = artifact_facts([read_header(ds4_small), reduced])
    assert facts.drafter is not None
    assert (facts.drafter.vocab_size, facts.drafter.draft_vocab) == (N_VOCAB, 100)


def test_a_drafter_that_does_not_fit_the_model_is_refused_with_its_reason(
    tmp_path: Path, ds4_small: Path, ds4_dspark: Path,
) -> None:
    shallow = write_tiny_deepseek4(tmp_path / "five.gguf", dataclasses.replace(SMALL, n_layer=5))
    with pytest.raises(DrafterMismatch, match=r"reads layers \[5, 6, 7\]") as outside:
        artifact_facts([read_header(shallow), read_header(ds4_dspark)])
    assert outside.value.reason == "DrafterMismatch"
    header = read_header(ds4_dspark)
    other_vocab = dataclasses.replace(
        header, array_lengths={**header.array_lengths, "tokenizer.ggml.tokens": 999})
    with pytest.raises(DrafterMismatch, match="999 tokens, the model's 175"):
        artifact_facts([read_header(ds4_small), other_vocab])
    with pytest.raises(IncompleteSplitSet, match="more than one drafter"):
        artifact_facts([read_header(ds4_small), header, dataclasses.replace(header, name="b")])


def test_the_manifest_command_reports_the_drafter_or_refuses_it(
    tmp_path: Path, ds4_small: Path, ds4_dspark: Path,
) -> None:
    def manifest(*paths: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "meshnet.cli", "artifact", "manifest",
                               *map(str, paths)],
                              capture_output=True, text=True, timeout=120, check=False)

    both = manifest(ds4_small, ds4_dspark)
    assert both.returncode == 0, both.stderr
    assert re.search(r"# drafter: DSpark in small-dspark.gguf, 3 stages reading main layers "
                     r"5, 6, 7, 5 tokens per pass, vocabulary 175, [\d,]+ bytes", both.stdout)
    assert "name: small\n" in both.stdout  # named for the model, not its drafter
    assert both.stdout.count("sha256:") == 2
    assert both.stdout.count("role: Drafter") == 1  # on the drafter's entry

    folder = tmp_path / "model"
    folder.mkdir()
    for path in (ds4_small, ds4_dspark):
        (folder / path.name).symlink_to(path)

    def verify(document: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "artifact.yaml").write_text(document)
        return subprocess.run([sys.executable, "-m", "meshnet.cli", "artifact", "verify",
                               str(folder), "--artifact", str(tmp_path / "artifact.yaml")],
                              capture_output=True, text=True, timeout=120, check=False)

    verified = verify(both.stdout)
    assert verified.returncode == 0, verified.stderr
    assert re.search(r"drafter +DSpark in small-dspark.gguf, 3 stages reading main layers "
                     r"5, 6, 7", verified.stdout)
    # A role that does not match the headers does not verify: a route loads what it names.
    def with_roles(drafter: str | None) -> str:
        document = yaml.safe_load(both.stdout)
        for entry in document["spec"]["files"]:
            entry["role"] = "Drafter" if entry["name"] == drafter else "Model"
        return yaml.safe_dump(document)

    unmarked = verify(with_roles(None))
    assert unmarked.returncode != 0
    assert "small-dspark.gguf is a DSpark drafter GGUF" in unmarked.stderr
    swapped = verify(with_roles(ds4_small.name))
    assert swapped.returncode != 0
    assert f"{ds4_small.name} has role Drafter but is not a DSpark drafter GGUF" in swapped.stderr
    shallow = write_tiny_deepseek4(tmp_path / "five.gguf", dataclasses.replace(SMALL, n_layer=5))
    refused = manifest(shallow, ds4_dspark)
    assert refused.returncode == 1
    assert "main layers 0..4" in refused.stderr


def test_a_split_model_and_its_drafter_make_one_artifact(tmp_path: Path, ds4_small: Path,
                                                          ds4_dspark: Path) -> None:
    split_tool = workspace() / "llama-build" / "install" / "bin" / "llama-gguf-split"
    folder = tmp_path / "model"
    folder.mkdir()
    subprocess.run([str(split_tool), "--split-max-size", "2M", str(ds4_small),
                    str(folder / "small")], check=True, capture_output=True, timeout=120)
    (folder / ds4_dspark.name).symlink_to(ds4_dspark)
    proc = subprocess.run([sys.executable, "-m", "meshnet.cli", "artifact", "manifest",
                           str(folder)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# 4 file(s)")  # 3 splits and the drafter
    assert "# drafter: DSpark in small-dspark.gguf" in proc.stdout
    assert "name: small\n" in proc.stdout


# --- the pinned llama.cpp loads them ---------------------------------------------------------


def test_the_mtp_model_loads_and_generates_the_tokens_of_the_model_without_it(
    shard_worker: Path, ds4_small: Path, ds4_small_mtp: Path, tmp_path: Path,
) -> None:
    plain = unsplit_tokens(ds4_small, PROMPT_TOKENS, 16, threads=1)
    assert unsplit_tokens(ds4_small_mtp, PROMPT_TOKENS, 16, threads=1) == plain
    spec = LaunchSpec(model=ds4_small_mtp, layers=LayerRange(0, 8), route_id="test/mtp",
                      threads=1, ctx=512)
    (worker,) = start_route(shard_worker, [spec], tmp_path)
    try:
        info = StageClient(worker.endpoint).info()
        assert (info.architecture, info.n_layer, info.n_vocab) == ("deepseek4", 8, N_VOCAB)
        with RouteDriver([worker.endpoint], topology="hub") as driver:
            generation = driver.generate(PROMPT_TOKENS, max_tokens=16, stop_at_eos=False)
    finally:
        worker.stop()
    assert generation.tokens == unsplit_tokens(ds4_small, generation.prompt_tokens, 16,
                                               threads=1)


def test_the_pinned_loader_loads_the_drafter_and_wants_the_targets_context(
    ds4_dspark: Path,
) -> None:
    """llama.cpp's own tool loads the drafter's tensors (markov head, tapped layers) and
    then asks for the target's context, which holds the embeddings and head it borrows."""
    bench = workspace() / "llama-build" / "install" / "bin" / "llama-bench"
    # --repack 0: the pin's AMX repack of Q8_0 weights crashes on our machines (the worker
    # turns it off too)
    proc = subprocess.run([str(bench), "-m", str(ds4_dspark), "-p", "5", "-n", "0", "-r", "1",
                           "-t", "1", "--repack", "0", "-v"], capture_output=True, text=True,
                          timeout=120, check=False)
    log = proc.stderr + proc.stdout
    assert "DFlash extract_layers = [6, 7, 8]" in log
    assert "DFlash with DSpark markov head (rank = 32)" in log
    loaded = re.search(r"CPU_Mapped model buffer size =\s+([\d.]+) MiB", log)
    assert loaded, log[-2000:]
    tensor_bytes = sum(read_header(ds4_dspark).tensor_bytes.values())
    assert abs(float(loaded.group(1)) - tensor_bytes / 2**20) < 0.01  # every tensor, mapped
    assert "dflash requires ctx_other to be set" in log  # loaded; drafting needs the target


def test_the_pinned_draft_paths_draft_with_both_test_models(
    ds4_small: Path, ds4_small_mtp: Path, ds4_dspark: Path, tmp_path: Path,
) -> None:
    """llama.cpp's own draft-mtp and draft-dspark run on them; greedy verification keeps the
    target's text whatever the (random) drafts, with or without the MTP block."""
    binary = build_speculative_example(tmp_path)
    prompt = "Hello the map of the world and the story of the sea coast line chart."
    mtp = run_draft(binary, ds4_small_mtp, "draft-mtp", None, prompt, 16, 4)
    dspark = run_draft(binary, ds4_small_mtp, "draft-dspark", ds4_dspark, prompt, 16, 4)
    plain_target = run_draft(binary, ds4_small, "draft-dspark", ds4_dspark, prompt, 16, 4)
    assert (mtp.kind, dspark.kind) == ("draft-mtp", "draft-dspark")
    for run in (mtp, dspark, plain_target):
        assert run.passes > 0 and run.passes <= run.drafted <= 4 * run.passes
        text = run.text.strip()
        assert text.startswith("<s> " + prompt) and len(text) > len(prompt) + 8
    assert mtp.text == dspark.text == plain_target.text
