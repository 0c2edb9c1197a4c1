"""The vulkan worker image really runs without a GPU: on the software Vulkan device it
carries (the lane's pinned lavapipe, switched on by the environment a GPU-less node sets)
its stages serve a split SmolLM2 route with the unsplit model's tokens on that device, as
non-root, with no compiler; left alone, it names no Vulkan driver, so a GPU node's is the
one found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshnet.images.vulkan_device import COPYRIGHT, DRIVER, MANIFEST, PREFIX

from .conftest import (
    N_TOKENS,
    SPLIT,
    WORKER_USER,
    Container,
    generate,
    image_reference,
    image_stages,
)

pytestmark = pytest.mark.vulkan

# What a node without a GPU sets. Lavapipe compiles each shader with LLVM when first used:
# a cache directory that outlives the process (here the container's /tmp, which the stages
# and the reference share) pays that once.
SOFTWARE_DEVICE = {"VK_DRIVER_FILES": str(PREFIX / MANIFEST), "GGML_VK_VISIBLE_DEVICES": "0",
                   "MESA_SHADER_CACHE_DIR": "/tmp/mesa-shader-cache"}
OFFLOAD_ALL = 99
# The start-up exactness probe steps 1 to 8 rows over 4 sessions, shaders a single request
# never uses: about 15 minutes of compiling on 2 cores. One greedy request needs no claim.
NO_EXACTNESS_CLAIM = ("--exact-batch-rows", "0")
# Where the Vulkan loader looks for drivers when nothing names one.
LOADER_SEARCH = ("/etc/vulkan/icd.d", "/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d",
                 "/etc/xdg/vulkan/icd.d")


@pytest.fixture(scope="module")
def route(vulkan_container: Container, smollm2: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One generation through the image's two stages, every layer on the software device."""
    log_dir = tmp_path_factory.mktemp("vulkan-image-route")
    stages = image_stages(vulkan_container, smollm2, log_dir, SOFTWARE_DEVICE, OFFLOAD_ALL,
                          NO_EXACTNESS_CLAIM)
    try:
        yield {"generation": generate(stages), "logs": [s.lines for s in stages]}
    finally:
        for stage in stages:
            stage.stop()


def test_the_vulkan_image_serves_a_split_route_on_its_software_device_with_the_unsplit_tokens(
        route: dict[str, Any], vulkan_container: Container, smollm2: Path) -> None:
    generation = route["generation"]

    for logs in route["logs"]:  # each stage computed on the device, not on the CPU
        assert any("using device Vulkan0 (llvmpipe" in line for line in logs), logs[:20]
    assert len(generation["tokens"]) == N_TOKENS
    assert [stage["layers"] for stage in generation["route"]["stages"]] == [list(s) for s in SPLIT]
    assert generation["tokens"] == image_reference(
        vulkan_container, smollm2, generation["prompt_tokens"], SOFTWARE_DEVICE, OFFLOAD_ALL)


def test_the_vulkan_image_names_no_driver_unless_told_and_carries_its_devices_libraries(
        vulkan_container: Container) -> None:
    shell = vulkan_container.run(
        "sh", "-c", f"env; ls {' '.join(LOADER_SEARCH)} 2>/dev/null; echo LDD; "
        f"ldd {PREFIX / DRIVER} | grep 'not found'; test -s {PREFIX / COPYRIGHT} && echo COPYRIGHT",
        user=WORKER_USER)
    environment, _, rest = shell.stdout.partition("LDD\n")
    listed = [line for line in environment.splitlines() if line and "=" not in line]

    assert not {"VK_DRIVER_FILES", "VK_ICD_FILENAMES", "GGML_VK_VISIBLE_DEVICES"} & {
        line.split("=")[0] for line in environment.splitlines()}
    assert [line for line in listed if line.endswith(".json")] == [], listed
    assert rest.split() == ["COPYRIGHT"], f"unresolved libraries of lavapipe: {rest}"
