"""Operator settings, read once from the environment (the Helm chart sets them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from meshnet.envnumbers import env_number
from meshnet.errors import MeshnetError, OperatorError
from meshnet.paths import repo_root
from meshnet.pin.manifest import load_manifest
from meshnet.reconcile.artifact.jobspec import ProvisionerConfig
from meshnet.reconcile.route.linkcompression import BREAK_EVEN_BITS_PER_SECOND
from meshnet.reconcile.route.networkpolicy import PolicyConfig
from meshnet.reconcile.route.podspec import WorkerConfig
from meshnet.reconcile.route.probespec import PlacementConfig
from meshnet.tracker.settings import TrackerSettings

LANES = ("cpu", "cuda", "rocm", "vulkan")


@dataclass(frozen=True)
class OperatorSettings:
    """Everything configurable about the operator; defaults suit a single-namespace test."""

    namespaces: tuple[str, ...] = ()  # empty: every namespace (cluster-wide)
    worker_images: Mapping[str, str] = field(default_factory=dict)  # lane -> image
    pin_digest: str = ""
    tracker_url: str | None = None
    tracker_secret: str | None = None  # Secret holding the Tracker bearer token
    tracker_token: str | None = field(default=None, repr=False)  # mounted from that Secret
    tracker: TrackerSettings = field(default_factory=TrackerSettings)  # reports, certify
    metrics_port: int = 8080  # the operator's own Prometheus endpoint (0: off)
    health_port: int = 8081  # kopf liveness endpoint (0: off)
    worker_grpc_port: int = 50051
    worker_metrics_port: int = 9090
    worker_pull_policy: str = "IfNotPresent"
    resync_seconds: float = 60.0  # periodic reconcile of every route
    max_concurrent_reconciles: int = 16  # bounds the API load (and httpx's pool queue)
    # Image of ModelArtifact provisioning Jobs (the operator's own); None: not provisioned.
    provisioner_image: str | None = None
    # Image of each route's gateway (`meshnet serve`: the operator's own); None: no gateways.
    gateway_image: str | None = None
    # How often every byte of a verified artifact copy is hashed again (0: never); in
    # between, files are trusted by their marker, which checks only size and mtime.
    artifact_rehash_seconds: float = 7 * 86400.0
    # Each route's NetworkPolicy: on, the operator's namespace and pod labels (let in to
    # the stages' gRPC port), the namespaces let in to their metrics port.
    network_policy: PolicyConfig = field(default_factory=PolicyConfig)
    # spec.placement Measured: the probe agents' port, and how often a route's nodes' links
    # are measured again while its nodes stay the same.
    placement_port: int = 7070
    placement_interval_seconds: float = 3600.0
    # spec.boundaryCompression Auto: legs measured slower than this pack their boundaries
    compression_break_even_mbps: float = BREAK_EVEN_BITS_PER_SECOND / 1e6

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorSettings:
        """MESHNET_* variables; a malformed value names the variable."""
        images = {lane: env[key] for lane in LANES
                  if (key := f"MESHNET_WORKER_IMAGE_{lane.upper()}") in env and env[key]}
        return cls(
            namespaces=tuple(n.strip() for n in env.get("MESHNET_NAMESPACES", "").split(",")
                             if n.strip()),
            worker_images=images,
            pin_digest=env.get("MESHNET_PIN_DIGEST") or _pin_from_checkout(),
            tracker_url=env.get("MESHNET_TRACKER_URL") or None,
            tracker_secret=env.get("MESHNET_TRACKER_SECRET") or None,
            tracker_token=env.get("MESHNET_TRACKER_TOKEN") or None,
            tracker=TrackerSettings.from_env(env),
            metrics_port=env_number(env, "MESHNET_METRICS_PORT", 8080, int),
            health_port=env_number(env, "MESHNET_HEALTH_PORT", 8081, int),
            worker_grpc_port=env_number(env, "MESHNET_WORKER_GRPC_PORT", 50051, int),
            worker_metrics_port=env_number(env, "MESHNET_WORKER_METRICS_PORT", 9090, int),
            worker_pull_policy=env.get("MESHNET_WORKER_PULL_POLICY", "IfNotPresent"),
            resync_seconds=env_number(env, "MESHNET_RESYNC_SECONDS", 60.0, float),
            max_concurrent_reconciles=max(1, env_number(env, "MESHNET_MAX_CONCURRENT_RECONCILES",
                                                     16, int)),
            provisioner_image=env.get("MESHNET_PROVISIONER_IMAGE") or None,
            gateway_image=env.get("MESHNET_GATEWAY_IMAGE") or None,
            artifact_rehash_seconds=max(0.0, env_number(env, "MESHNET_ARTIFACT_REHASH_SECONDS",
                                                        7 * 86400.0, float)),
            network_policy=_policy_config(env),
            placement_port=env_number(env, "MESHNET_PLACEMENT_PORT", 7070, int),
            placement_interval_seconds=env_number(env, "MESHNET_PLACEMENT_INTERVAL_SECONDS",
                                                  3600.0, float),
            compression_break_even_mbps=env_number(
                env, "MESHNET_COMPRESSION_BREAK_EVEN_MBPS", BREAK_EVEN_BITS_PER_SECOND / 1e6,
                float),
        )

    def provisioner_config(self, image: str) -> ProvisionerConfig:
        every = self.artifact_rehash_seconds
        return ProvisionerConfig(image=image,
                                 rehash_every=timedelta(seconds=every) if every else None)

    def placement_config(self) -> PlacementConfig:
        """Probe agents and measuring Jobs run the operator's image (the gateway's)."""
        return PlacementConfig(image=self.gateway_image, port=self.placement_port,
                               interval_seconds=self.placement_interval_seconds,
                               pull_policy=self.worker_pull_policy,
                               compression_break_even_bits_per_second=(
                                   self.compression_break_even_mbps * 1e6))

    def worker_config(self) -> WorkerConfig:
        return WorkerConfig(
            images=dict(self.worker_images), pin_digest=self.pin_digest,
            grpc_port=self.worker_grpc_port, metrics_port=self.worker_metrics_port,
            image_pull_policy=self.worker_pull_policy, gateway_image=self.gateway_image,
            network_policy=self.network_policy,
        )


def _policy_config(env: Mapping[str, str]) -> PolicyConfig:
    """MESHNET_NETWORK_POLICY (on unless "false"), MESHNET_OPERATOR_NAMESPACE,
    MESHNET_OPERATOR_POD_LABELS (k=v,k=v) and MESHNET_METRICS_NAMESPACES (a,b)."""
    pairs = [p.split("=", 1) for p in env.get("MESHNET_OPERATOR_POD_LABELS", "").split(",")
             if p.strip()]
    if any(len(p) != 2 for p in pairs):
        raise OperatorError("MESHNET_OPERATOR_POD_LABELS must be key=value pairs, comma"
                            " separated")
    default = PolicyConfig()
    return PolicyConfig(
        enabled=env.get("MESHNET_NETWORK_POLICY", "true").strip().lower() != "false",
        operator_namespace=env.get("MESHNET_OPERATOR_NAMESPACE", "").strip(),
        operator_labels={k.strip(): v.strip() for k, v in pairs} or default.operator_labels,
        metrics_namespaces=tuple(n.strip() for n in env.get("MESHNET_METRICS_NAMESPACES",
                                                            "").split(",") if n.strip()),
    )


def _pin_from_checkout() -> str:
    """The pin digest of llama-pin.yaml when running from a checkout (or an image holding it)."""
    try:
        return load_manifest(repo_root() / "llama-pin.yaml").digest()
    except (FileNotFoundError, MeshnetError) as exc:
        raise OperatorError(
            f"MESHNET_PIN_DIGEST is not set and llama-pin.yaml is unusable: {exc}"
        ) from exc
