"""The images really run: the CPU worker image serves a split SmolLM2 route that gives the
unsplit model's tokens (also on the x86-64 baseline kernels, without AVX), the operator
image's CLI validates the examples, and they (the vulkan worker image too) run as non-root
users that can write nowhere but /tmp, with no compiler or build tree inside."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    MODELS,
    N_TOKENS,
    OPERATOR_USER,
    REPO,
    SPLIT,
    WORKER_USER,
    Container,
    generate,
    image_reference,
    image_stages,
    writable_paths,
)

Reference = Callable[..., list[int]]


@pytest.fixture(scope="module")
def routes(worker_container: Container, smollm2: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """One generation through the image's stages with ggml's own CPU module choice and one
    with the x64 module forced; the stages' logs beside each."""
    results: dict[str, dict[str, Any]] = {}
    for name, env in (("auto", {}), ("x64", {"MESHNET_CPU_VARIANT": "x64"})):
        log_dir = tmp_path_factory.mktemp(f"image-route-{name}")
        stages = image_stages(worker_container, smollm2, log_dir, env)
        try:
            results[name] = {"generation": generate(stages), "env": env,
                             "logs": [line for s in stages for line in s.lines]}
        finally:
            for stage in stages:
                stage.stop()
    yield results


def cpu_backend_line(logs: list[str]) -> str:
    return next(line for line in logs if "cpu backend" in line)


def test_the_worker_image_serves_a_split_route_with_the_unsplit_models_tokens(
        routes: dict[str, dict[str, Any]], reference: Reference) -> None:
    generation = routes["auto"]["generation"]

    assert len(generation["tokens"]) == N_TOKENS
    assert generation["tokens"] == reference(generation["prompt_tokens"], N_TOKENS)
    assert [stage["layers"] for stage in generation["route"]["stages"]] == [list(s) for s in SPLIT]


def test_the_worker_image_forced_to_the_x64_baseline_computes_without_avx_and_stays_exact(
        routes: dict[str, dict[str, Any]], worker_container: Container, smollm2: Path) -> None:
    """x64 is ggml's baseline module (no AVX, so no AVX2): what a CPU without AVX2 gets.
    Its tokens are compared with the unsplit model on the same module: the AVX-512, AVX2
    and baseline kernels of upstream ggml round differently (e.g. softmax and f32 dot
    products accumulate 16, 8 or 1 lanes at a time), so across modules a near-tie may go
    the other way, while a split route must always match the unsplit model it splits."""
    forced = routes["x64"]
    generation = forced["generation"]

    backend = cpu_backend_line(forced["logs"])
    assert "(MESHNET_CPU_VARIANT=x64)" in backend and "AVX" not in backend, backend
    assert generation["prompt_tokens"] == routes["auto"]["generation"]["prompt_tokens"]
    assert generation["tokens"] == image_reference(
        worker_container, smollm2, generation["prompt_tokens"], forced["env"])


def test_the_image_picks_the_best_cpu_module_its_host_runs(
        routes: dict[str, dict[str, Any]]) -> None:
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
    backend = cpu_backend_line(routes["auto"]["logs"])

    if "avx512f" in flags:
        assert "AVX512" in backend, backend
    elif {"avx2", "f16c", "fma"} <= set(flags):
        assert "AVX2" in backend and "AVX512" not in backend, backend


def test_a_forced_cpu_module_that_does_not_exist_stops_the_worker_with_the_reason(
        worker_container: Container, smollm2: Path) -> None:
    result = worker_container.run(
        "/usr/local/bin/meshnet-shard-worker", "--model", f"{MODELS}/{smollm2.name}",
        "--layers", "0:15", "--listen", "127.0.0.1:0", "--metrics-listen", "",
        user=WORKER_USER, env={"MESHNET_CPU_VARIANT": "pentium"},
        volumes={smollm2.parent: MODELS})

    assert result.returncode != 0
    assert "MESHNET_CPU_VARIANT=pentium: no CPU module /usr/local/bin/libggml-cpu-pentium.so" \
        in result.stderr


def test_the_operator_image_runs_the_cli_and_validates_the_examples(
        operator_container: Container) -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    files = [arg for example in examples for arg in ("-f", f"/examples/{example.name}")]

    shown = operator_container.run("meshnet", "--help", user=OPERATOR_USER)
    validated = operator_container.run("meshnet", "validate", *files, user=OPERATOR_USER,
                                       volumes={REPO / "examples": "/examples"})

    assert shown.returncode == 0 and "operator" in shown.stdout, shown.stderr
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert validated.stdout.count("valid    ") == len(examples)


@pytest.mark.parametrize(("container_fixture", "user"), [
    ("worker_container", WORKER_USER), ("operator_container", OPERATOR_USER),
    pytest.param("vulkan_container", WORKER_USER, marks=pytest.mark.vulkan)])
def test_the_images_run_as_non_root_with_nothing_to_write_and_no_compiler(
        container_fixture: str, user: str, request: pytest.FixtureRequest) -> None:
    """What a read-only root filesystem needs: the image's user can write only the
    temporary directories (which stay empty after a route ran, see `routes`)."""
    container: Container = request.getfixturevalue(container_fixture)
    shell = container.run("sh", "-c", "id -u; ls -A /tmp; for c in cc gcc g++ c++ clang "
                          "cmake make; do command -v $c; done; ls -d /src /work /.work "
                          "2>/dev/null; true", user=None)
    uid, *rest = shell.stdout.split("\n")

    assert uid == user.split(":")[0]
    assert [line for line in rest if line] == [], f"compiler, build tree or temp file: {rest}"
    assert set(writable_paths(container, user)) <= {"/tmp", "/var/tmp"}
