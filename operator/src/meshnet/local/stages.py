"""One stage pod of the plan, run as a worker process on loopback."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshnet.api import labels
from meshnet.local.process import LaunchSpec, WorkerProcess
from meshnet.reconcile.route import ObservedPod, WorkerSpec
from meshnet.reconcile.route.worker_command import worker_command


def launch_spec(worker: WorkerSpec, model_path: Path, threads: int,
                links: Mapping[str, str] | None = None,
                route_key_file: Path | None = None) -> LaunchSpec:
    """How this machine runs the planned `worker`: the artifact's model file here, ports
    the worker picks on 127.0.0.1, `links` (stage name -> loopback endpoint) for the
    stages it relays to, and the route's key."""
    if worker.tls is not None:  # its certificate would come from a Secret: there is none here
        raise ValueError("the local backend cannot run a route with spec.tls.mode Secret"
                         " (without spec.tls it runs plaintext on loopback)")
    command = worker_command(worker, model_path, "127.0.0.1:0", "127.0.0.1:0", links or {},
                             route_key_file=route_key_file)
    # a `meshnet up` that is killed leaves no worker behind
    return LaunchSpec.of(command, threads=threads, exit_with_parent=True)


def worker_name(stage: str, replica: int) -> str:
    """A stage of a replica: its name alone for replica 0 (as before replicas existed)."""
    return stage if replica == 0 else f"{stage} of replica {replica}"


@dataclass
class LocalStage:
    """A stage pod and its process; `restarts` counts crashes, as the kubelet would."""

    pod: dict[str, Any]
    worker: WorkerSpec
    process: WorkerProcess
    restarts: int = 0
    failed_at: float | None = None  # when the process was last seen dead
    retiring: bool = False  # an old epoch kept serving until the new one is ready, or:
    draining_since: float | None = None  # a scaled-away replica's, since (monotonic)
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

    @property
    def replica(self) -> int:
        return int(self.labels.get(labels.REPLICA, "0"))

    @property
    def who(self) -> str:
        """The stage as messages and the restart budget name it."""
        return worker_name(self.stage, self.replica)

    def alive(self) -> bool:
        return self.process.running()

    def ready(self) -> bool:
        """Running, and its gRPC health SERVING (what a pod's readiness probe asks): a
        ring's head only once subscribed at the last stage, or after --ring-ready-ms."""
        return self.alive() and self.process.serving()

    def observed(self) -> ObservedPod:
        running = self.alive()
        return ObservedPod(
            name=self.name,
            stage=self.stage,
            epoch=self.epoch,
            replica=self.replica,
            template_hash=self.labels.get(labels.TEMPLATE, ""),
            digest=self.labels.get(labels.DIGEST, ""),
            phase="Running" if running else "Failed",
            ready=self.ready(),
            restarts=self.restarts,
            failing_reason=None if running else "CrashLoopBackOff",
            failing_message="" if running else f"worker exited with {self.process.exit_code()}",
        )
