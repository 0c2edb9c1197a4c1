"""How `meshnet up` wires a chain or a ring on loopback: a planned worker names the
stages it relays to (WorkerSpec.links); here those are the loopback endpoints of the same
epoch's workers, which must listen before it starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshnet.errors import MeshnetError
from meshnet.reconcile.route import WorkerSpec


class NotListening(MeshnetError):
    """A stage the worker relays to has no worker of its epoch listening yet."""


def loopback_links(worker: WorkerSpec, listening: Mapping[str, str]) -> dict[str, str]:
    """Stage name -> loopback endpoint for each stage `worker` relays to, from `listening`
    (stage name -> endpoint of a running worker of its epoch); NotListening names the
    stages missing."""
    names = worker.links.names()
    missing = sorted(name for name in names if name not in listening)
    if missing:
        raise NotListening(f"waiting for stage {', '.join(missing)} to listen")
    return {name: listening[name] for name in names}


def start_order(workers: Sequence[WorkerSpec]) -> list[WorkerSpec]:
    """`workers`, each after the workers it links to: a chain starts from its last stage,
    so that every stage names a worker that already listens. Unlinked ones keep their
    order."""
    by_stage = {worker.stage: worker for worker in workers}
    ordered: list[WorkerSpec] = []
    seen: set[str] = set()

    def visit(worker: WorkerSpec) -> None:
        if worker.stage in seen:
            return
        seen.add(worker.stage)
        for name in worker.links.names():
            if name in by_stage:
                visit(by_stage[name])
        ordered.append(worker)

    for worker in workers:
        visit(worker)
    return ordered
