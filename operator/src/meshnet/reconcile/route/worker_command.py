"""The one renderer of a worker's command line, for both backends: a planned worker
(WorkerSpec) and where a backend runs it (its model file, ports, TLS files and the
addresses of its links) become meshnet-shard-worker flags (docs/worker-flags.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath

from meshnet.api.drafter_kind import DrafterKind
from meshnet.api.shardroute import LayerRange
from meshnet.reconcile.route.workerspec import WorkerSpec

# --gpu-layers: llama.cpp offloads the last N layers of the whole model, so more than any
# model has puts every layer a stage owns, and the last stage's output head, on its GPUs.
OFFLOAD_ALL_LAYERS = 9999
COMPRESSED = "shuffle-lz4"  # the worker's --boundary-compression word for packed boundaries


@dataclass(frozen=True)
class WorkerCommand:
    """A worker's flags, named as the worker names them; None (or "", 0 where the worker's
    default is 0) leaves a flag out, to the worker's default."""

    model: PurePath
    layers: LayerRange
    route_id: str = "local"
    epoch: int = 1
    listen: str = "127.0.0.1:0"
    metrics_listen: str = "127.0.0.1:0"
    slots: int = 4
    ctx: int = 4096
    batch: int | None = 512
    threads: int | None = 0
    gpu_layers: int = 0
    boundary_dtype: str = "f32"
    manifest_digest: str = ""
    recipe_digest: str = ""
    route_digest: str = ""
    evict_idle_ms: int | None = None
    max_message_bytes: int | None = None
    tls_cert: PurePath | None = None
    tls_key: PurePath | None = None
    tls_client_ca: PurePath | None = None
    next_stage_ca: PurePath | None = None  # verifies next_stage over TLS (default: tls_client_ca)
    next_stage: str = ""
    ring_last: str = ""  # ring, on the first stage: the route's last stage
    local_relay: bool = True  # off: the chain's Relay to and from this stage stays on gRPC
    # The route's key (see meshnet.route.route_key): callers of the calls that run or end a
    # session must prove it, and the ring and the local relay need it.
    route_key_file: PurePath | None = None
    ring_subscribers: int | None = None  # a last stage's Ring streams at most; None: default
    pipeline_depth: int = 0  # stages in the route; 0: the worker derives it from its range
    # A first stage's speculative decode loops: most drafts per window (0: none) and
    # windows in flight; None: the worker's defaults.
    max_loop_drafts: int | None = None
    max_loop_windows: int | None = None
    discard_depth: int | None = None  # positions one rejection may drop; None: the default
    # A last stage's drafter, its most drafts per token, and the DSpark GGUF.
    drafter: DrafterKind | None = None
    drafter_k: int | None = None
    drafter_model: PurePath | None = None
    # Prefix cache: released sessions' slots kept (0: off) and the block it reuses in;
    # None: the worker's defaults.
    prefix_cache_entries: int | None = None
    prefix_block: int | None = None
    # --batching throughput: sessions share steps as upstream batches (recipe.batching)
    throughput_batching: bool = False
    boundary_compression: str | None = None  # --boundary-compression; None: the default (off)
    extra: tuple[str, ...] = ()

    def args(self, parent_pid: int | None = None) -> list[str]:
        """The command line (without the binary); `parent_pid`: --exit-with-parent."""
        flags: list[tuple[str, object]] = [
            ("--model", self.model),
            ("--layers", self.layers),
            ("--route-id", self.route_id),
            ("--epoch", self.epoch),
            ("--manifest-digest", self.manifest_digest or None),
            ("--recipe-digest", self.recipe_digest or None),
            ("--route-digest", self.route_digest or None),
            ("--listen", self.listen),
            ("--metrics-listen", self.metrics_listen),
            ("--slots", self.slots),
            ("--ctx", self.ctx),
            ("--batch", self.batch),
            ("--threads", self.threads),
            ("--boundary-dtype", self.boundary_dtype),
            ("--pipeline-depth", self.pipeline_depth or None),
            ("--max-loop-drafts", self.max_loop_drafts),
            ("--max-loop-windows", self.max_loop_windows),
            ("--discard-depth", self.discard_depth),
            ("--drafter", self.drafter.value if self.drafter else None),
            ("--drafter-k", self.drafter_k),
            ("--drafter-model", self.drafter_model),
            ("--prefix-cache-entries", self.prefix_cache_entries),
            ("--prefix-block", self.prefix_block),
            ("--batching", "throughput" if self.throughput_batching else None),
            ("--gpu-layers", self.gpu_layers or None),
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
            ("--tls-client-ca", self.tls_client_ca),
            ("--next-stage", self.next_stage or None),
            ("--next-stage-ca", self.next_stage_ca),
            ("--boundary-compression", self.boundary_compression),
            ("--ring-last", self.ring_last or None),
            ("--evict-idle-ms", self.evict_idle_ms),
            ("--max-message-bytes", self.max_message_bytes),
            ("--local-relay", None if self.local_relay else "off"),
            ("--route-key-file", self.route_key_file),
            ("--ring-subscribers", self.ring_subscribers),
            ("--exit-with-parent", parent_pid),
        ]
        args = [text for flag, value in flags if value is not None
                for text in (flag, str(value))]
        return args + list(self.extra)


def worker_command(worker: WorkerSpec, model: PurePath, listen: str, metrics_listen: str,
                   links: Mapping[str, str], tls_dir: PurePath | None = None,
                   route_key_file: PurePath | None = None) -> WorkerCommand:
    """`worker` run with its `model` file (the artifact's others beside it), gRPC and
    metrics on `listen` and `metrics_listen`, `links` (stage name -> address) for the
    stages it relays to, for a worker with TLS, tls.crt, tls.key and ca.crt in
    `tls_dir`, and the route's key in `route_key_file`. Leaves batch and threads to the
    worker."""
    unresolved = sorted(set(worker.links.names()) - set(links))
    if unresolved:  # a chain that silently became a hub would only be slower
        raise ValueError(f"no address given for stage {', '.join(unresolved)}")
    tls, drafter = worker.tls, worker.drafter
    if tls is not None and tls_dir is None:
        raise ValueError("a worker with TLS needs the directory of its certificate")
    tls_files = tls_dir if tls is not None else None
    return WorkerCommand(
        model=model,
        layers=worker.layers,
        route_id=worker.route_id,
        epoch=worker.epoch,
        manifest_digest=worker.identities.manifest_digest,
        recipe_digest=worker.identities.recipe_digest,
        route_digest=worker.identities.route_digest,
        listen=listen,
        metrics_listen=metrics_listen,
        slots=worker.slots,
        ctx=worker.context_length,
        batch=None,
        threads=None,
        boundary_dtype=worker.boundary_dtype,
        pipeline_depth=worker.pipeline_depth,
        max_loop_drafts=worker.loop.drafts if worker.loop else None,
        max_loop_windows=worker.loop.windows if worker.loop else None,
        discard_depth=worker.discard_depth or None,
        prefix_cache_entries=worker.prefix_cache_entries or None,
        prefix_block=worker.prefix_block or None,
        throughput_batching=worker.throughput_batching,
        drafter=drafter.kind if drafter else None,
        drafter_k=drafter.max_drafts if drafter else None,
        drafter_model=model.parent / drafter.model_file
        if drafter and drafter.model_file else None,
        gpu_layers=OFFLOAD_ALL_LAYERS if worker.offload else 0,
        tls_cert=tls_files / "tls.crt" if tls_files else None,
        tls_key=tls_files / "tls.key" if tls_files else None,
        tls_client_ca=tls_files / "ca.crt" if tls_files and tls and tls.require_client_cert
        else None,
        next_stage=links[worker.links.next_stage] if worker.links.next_stage else "",
        # the next stage's certificate is the route's too
        next_stage_ca=tls_files / "ca.crt" if tls_files and worker.links.next_stage else None,
        # (what it relays: a stage that relays nothing has nothing to pack)
        boundary_compression=COMPRESSED if worker.compress_boundaries and worker.links.next_stage
        else None,
        ring_last=links[worker.links.ring_last] if worker.links.ring_last else "",
        route_key_file=route_key_file,
    )
