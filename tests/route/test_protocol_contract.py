"""The wire contract: buf lint is clean, v1 has no breaking change against its released
image, every ErrorReason is documented, and the generated Python code is current."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshnet.route import codegen
from meshnet.route.proto import pb

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"
SERVICE = PROTO / "meshnet" / "shard" / "v1" / "shard_service.proto"


def buf() -> str:
    found = shutil.which("buf") or str(Path(sys.executable).parent / "buf")
    if not Path(found).exists():
        pytest.fail("the buf CLI is missing: pip install buf-bin (a dev dependency)")
    return found


def run_buf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [buf(), *args], cwd=PROTO, capture_output=True, text=True, timeout=120, check=False
    )


def test_buf_lint_passes() -> None:
    result = run_buf("lint", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_v1_has_no_breaking_change_against_the_released_image() -> None:
    result = run_buf("breaking", ".", "--against", "released/meshnet-shard-v1.binpb")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_breaking_check_catches_a_removed_field(tmp_path: Path) -> None:
    changed = tmp_path / "proto"
    shutil.copytree(PROTO, changed)
    target = changed / SERVICE.relative_to(PROTO)
    target.write_text(target.read_text().replace("  int64 n_past = 2;\n", "", 1))
    result = subprocess.run(
        [buf(), "breaking", ".", "--against", str(PROTO / "released" / "meshnet-shard-v1.binpb")],
        cwd=changed, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode != 0
    assert "n_past" in result.stdout + result.stderr


def test_every_error_reason_is_documented_in_the_service_contract() -> None:
    text = SERVICE.read_text()
    service_doc = text[text.index("service ShardService"):text.index("enum ErrorReason")]
    for name in pb.ErrorReason.keys():  # noqa: SIM118 (an EnumTypeWrapper, not a dict)
        if name == "ERROR_REASON_UNSPECIFIED":
            continue
        reason = name.removeprefix("ERROR_REASON_")
        assert re.search(rf"\b{reason}\b", service_doc), f"{reason} is not documented on an RPC"


def test_every_rpc_documents_failures_and_retries() -> None:
    text = SERVICE.read_text()
    blocks = re.findall(r"((?:  //.*\n)+)  rpc (\w+)", text)
    assert len(blocks) == 9
    for comment, rpc in blocks:
        assert "Failures" in comment, rpc
        assert "Retry" in comment, rpc


def test_the_generated_python_code_is_current() -> None:
    assert codegen.is_current()
