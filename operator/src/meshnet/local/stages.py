"""One stage pod of the plan, run as a worker process on loopback."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshnet.api import labels
from meshnet.reconcile import ObservedPod
from meshnet.route.launch import RING_SUBSCRIBED, WorkerProcess, WorkerSpec

# Pod args the local backend rewrites: files live on this machine, ports on loopback.
_LOCAL_FLAGS = {
    "--model",
    "--listen",
    "--metrics-listen",
    "--layers",
    "--route-id",
    "--epoch",
    "--slots",
    "--ctx",
    "--boundary-dtype",
    "--gpu-layers",
    "--pipeline-depth",
    "--manifest-digest",
    "--recipe-digest",
    "--route-digest",
    "--next-stage",
    "--ring-last",
}


def worker_spec(pod: dict[str, Any], model_path: Path, threads: int,
                links: Mapping[str, str] | None = None) -> WorkerSpec:
    """The pod's worker arguments, with the model path and addresses of this machine;
    `links` gives the loopback endpoints of its --next-stage and --ring-last."""
    args: list[str] = pod["spec"]["containers"][0]["args"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    unknown = sorted(set(flags) - _LOCAL_FLAGS)
    if unknown:  # e.g. TLS material mounted from a Secret: there is no Secret here
        raise ValueError(f"the local backend cannot run pods with {', '.join(unknown)}")
    links = links or {}
    unresolved = sorted((set(flags) & {"--next-stage", "--ring-last"}) - set(links))
    if unresolved:  # a chain that silently became a hub would only be slower
        raise ValueError(f"no loopback endpoint given for {', '.join(unresolved)}")
    begin, end = flags["--layers"].split(":")
    return WorkerSpec(
        model=model_path,
        layers=(int(begin), int(end)),
        route_id=flags["--route-id"],
        epoch=int(flags["--epoch"]),
        slots=int(flags["--slots"]),
        ctx=int(flags["--ctx"]),
        boundary_dtype=flags["--boundary-dtype"],
        gpu_layers=int(flags.get("--gpu-layers", 0)),
        pipeline_depth=int(flags.get("--pipeline-depth", 0)),
        manifest_digest=flags.get("--manifest-digest", ""),
        recipe_digest=flags.get("--recipe-digest", ""),
        route_digest=flags.get("--route-digest", ""),
        next_stage=links.get("--next-stage", ""),
        ring_last=links.get("--ring-last", ""),
        threads=threads,
        exit_with_parent=True,  # a `meshnet up` that is killed leaves no worker behind
    )


@dataclass
class LocalStage:
    """A stage pod and its process; `restarts` counts crashes, as the kubelet would."""

    pod: dict[str, Any]
    process: WorkerProcess
    restarts: int = 0
    failed_at: float | None = None  # when the process was last seen dead
    retiring: bool = False  # an old epoch kept serving until the new one is ready
    started_at: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.pod["metadata"]["labels"])

    @property
    def stage(self) -> str:
        return self.labels[labels.STAGE]

    @property
    def epoch(self) -> int:
        return int(self.labels[labels.EPOCH])

    def alive(self) -> bool:
        return self.process.running()

    def ready(self) -> bool:
        """Running, and a ring's head subscribed at the last stage (its readiness probe):
        until then a route would serve as a chain, a leg slower per token."""
        if not self.alive():
            return False
        return not self.process.spec.ring_last or any(
            RING_SUBSCRIBED in line for line in self.process.lines)

    def observed(self) -> ObservedPod:
        running = self.alive()
        return ObservedPod(
            name=self.name,
            stage=self.stage,
            epoch=self.epoch,
            template_hash=self.labels.get(labels.TEMPLATE, ""),
            digest=self.labels.get(labels.DIGEST, ""),
            phase="Running" if running else "Failed",
            ready=self.ready(),
            restarts=self.restarts,
            failing_reason=None if running else "CrashLoopBackOff",
            failing_message="" if running else f"worker exited with {self.process.exit_code()}",
        )
