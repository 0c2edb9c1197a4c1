"""Which lane a route runs on, and what its certificate says about it (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from meshnet.api.certification import NO_GPU, Certificate, CertifiedLane
from meshnet.api.shardroute import Recipe
from meshnet.api.tracker import CertificationState

# Node labels naming the GPU product, per lane, as the vendors' feature discovery sets them.
GPU_PRODUCT_LABELS: dict[str, tuple[str, ...]] = {
    "cuda": ("nvidia.com/gpu.product",),
    "rocm": ("amd.com/gpu.product-name", "amd.com/gpu.product"),
    "vulkan": ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "gpu.intel.com/product"),
}
UNKNOWN = "unknown"


def gpu_product(backend: str, node_labels: Iterable[Mapping[str, str]]) -> str:
    """The GPU product of the stages' nodes: 'none' on cpu, several joined with '+'
    (a mixed route is its own lane), 'unknown' when a node carries no product label."""
    if backend == "cpu":
        return NO_GPU
    keys = GPU_PRODUCT_LABELS.get(backend, ())
    products = {next((labels[k] for k in keys if labels.get(k)), UNKNOWN)
                for labels in node_labels}
    return "+".join(sorted(products)) or UNKNOWN


def promises(recipe: Recipe) -> dict[str, Any]:
    """What the route promises beyond a plain split, as CertifiedLane fields: verify
    windows of maxDrafts + 1 rows when it speculates, sessionSlots sessions at once (each
    as alone, unless its batching is Throughput)."""
    return {"verify_rows": recipe.speculation.max_drafts + 1 if recipe.speculation.enabled
            else 1, "sessions": recipe.session_slots, "batching": recipe.batching}


def state(lane: CertifiedLane | None, certificate: Certificate | None) -> CertificationState:
    return CertificationState(lane=lane, certificate=certificate,
                              passed=lane is not None and certificate is not None
                              and certificate.valid_for(lane))


def verdict(current: CertificationState) -> tuple[str, str]:
    """(reason, message) for a lane that is not certified; ("", "") when it is. The
    reasons are the report's UnavailableReason codes."""
    lane, cert = current.lane, current.certificate
    if current.passed:
        return "", ""
    if lane is None:
        return "LaneNotCertified", "the route's lane is not known yet (no identity or nodes)"
    if cert is None:
        return "LaneNotCertified", f"lane {lane.describe()} has no certificate"
    if cert.lane != lane:
        changed = ", ".join(lane.differences(cert.lane))
        return "LaneNotCertified", (f"the certificate is for another lane ({changed}):"
                                    f" lane {lane.describe()} needs its own")
    return "CertificationFailed", (f"lane {lane.describe()} failed certification"
                                   f" ({', '.join(cert.reasons)}) at {cert.certified_at}: "
                                   + "; ".join(cert.failures))
