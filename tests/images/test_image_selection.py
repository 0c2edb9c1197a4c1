"""Which images `meshnet images build` makes unless told: the operator and the CPU lane's,
and a GPU lane's only where its portable build (a whole GPU llama.cpp) is already there."""

from __future__ import annotations

from meshnet.images.build import IMAGES, default_images, order


def test_a_gpu_lanes_images_are_built_by_default_only_where_its_portable_build_exists() -> None:
    assert default_images(lambda lane: False) == ["worker-cpu", "operator", "certify-cpu"]
    assert default_images(lambda lane: lane == "vulkan") == [
        "worker-cpu", "operator", "certify-cpu", "worker-vulkan", "certify-vulkan"]


def test_each_certify_image_is_built_on_its_lanes_worker_image() -> None:
    for lane in ("cpu", "vulkan", "cuda"):
        assert order([f"certify-{lane}"]) == [f"worker-{lane}", f"certify-{lane}"]
        assert IMAGES[f"worker-{lane}"].lane == IMAGES[f"certify-{lane}"].lane == lane
