"""Settings of Tracker reporting and certification, read from MESHNET_* variables beside
the operator's own (the Helm chart sets them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.certify.gates import Gates
from meshnet.digests import canonical_digest
from meshnet.envnumbers import env_number
from meshnet.errors import MeshnetError
from meshnet.paths import repo_root
from meshnet.pin.manifest import load_manifest
from meshnet.tracker.client import RetryPolicy
from meshnet.tracker.inputs import PinFacts

LANES = ("cpu", "cuda", "rocm", "vulkan")


@dataclass(frozen=True)
class TrackerSettings:
    provider_id: str = "meshnet"
    cluster_id: str = ""  # empty: the kube-system namespace's uid (else "unknown")
    sample_seconds: float = 5.0  # how often every stage is asked for its capacity
    report_seconds: float = 30.0  # an unchanged report is re-sent at least this often
    stage_timeout_seconds: float = 2.0  # per GetInfo/GetCapacity call
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    token_file: str | None = None  # a mounted Secret key, re-read on every report
    certify_images: Mapping[str, str] = field(default_factory=dict)  # lane -> image
    gates: Gates = field(default_factory=Gates)
    certify_deadline_seconds: int = 3600

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TrackerSettings:
        images = {lane: env[key] for lane in LANES
                  if (key := f"MESHNET_CERTIFY_IMAGE_{lane.upper()}") in env and env[key]}
        defaults = Gates()
        return cls(
            provider_id=env.get("MESHNET_PROVIDER_ID") or "meshnet",
            cluster_id=env.get("MESHNET_CLUSTER_ID", ""),
            sample_seconds=env_number(env, "MESHNET_TRACKER_SAMPLE_SECONDS", 5.0, float),
            report_seconds=env_number(env, "MESHNET_TRACKER_REPORT_SECONDS", 30.0, float),
            stage_timeout_seconds=env_number(env, "MESHNET_TRACKER_STAGE_TIMEOUT_SECONDS", 2.0,
                                          float),
            retry=RetryPolicy(attempts=max(1, env_number(env, "MESHNET_TRACKER_ATTEMPTS", 4, int))),
            token_file=env.get("MESHNET_TRACKER_TOKEN_FILE") or None,
            certify_images=images,
            gates=Gates(
                tolerance=env_number(env, "MESHNET_CERTIFY_TOLERANCE", defaults.tolerance, float),
                speed_fraction=env_number(env, "MESHNET_CERTIFY_SPEED_FRACTION",
                                       defaults.speed_fraction, float)),
            certify_deadline_seconds=env_number(env, "MESHNET_CERTIFY_DEADLINE_SECONDS", 3600, int),
        )

    def token(self, fallback: str | None) -> str | None:
        """The bearer token: the mounted file when configured (rotations apply at once),
        else the value the chart put in the environment from the same Secret."""
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip() or None
            except OSError:
                return fallback
        return fallback


def pin_facts() -> PinFacts:
    """llama.cpp commit and patch-stack digest from llama-pin.yaml, where there is one."""
    try:
        manifest = load_manifest(repo_root() / "llama-pin.yaml")
    except (FileNotFoundError, MeshnetError):
        return PinFacts()
    return PinFacts(llama_cpp_commit=manifest.upstream.commit,
                    patch_stack_digest=canonical_digest([p.sha256 for p in manifest.patches]))


