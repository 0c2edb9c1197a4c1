"""How `meshnet up` wires a chain or a ring on loopback: a stage pod names the stages it
relays to by their cluster addresses (--next-stage, --ring-last); here those are the
loopback endpoints of the same epoch's workers, which must listen before it starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshnet.api import labels
from meshnet.errors import MeshnetError
from meshnet.reconcile.naming import endpoint

LINK_FLAGS = ("--next-stage", "--ring-last")


class NotListening(MeshnetError):
    """A stage the pod relays to has no worker of the pod's epoch listening yet."""


def pod_address(pod: Mapping[str, Any], grpc_port: int) -> str:
    """The address other pods of the route name this one by (as the planner builds it)."""
    meta = pod["metadata"]
    return endpoint(meta["labels"][labels.STAGE], meta["labels"][labels.ROUTE],
                    meta["namespace"], grpc_port)


def pod_links(pod: Mapping[str, Any]) -> dict[str, str]:
    """flag -> cluster address, for the link flags the pod's worker has."""
    args: list[str] = pod["spec"]["containers"][0]["args"]
    return {flag: args[args.index(flag) + 1] for flag in LINK_FLAGS if flag in args}


def loopback_links(pod: Mapping[str, Any], listening: Mapping[str, str]) -> dict[str, str]:
    """flag -> loopback endpoint, from `listening` (cluster address -> endpoint of a
    running worker of the pod's epoch); NotListening names the stages missing."""
    links = pod_links(pod)
    missing = sorted(address for address in links.values() if address not in listening)
    if missing:
        raise NotListening(f"waiting for {', '.join(missing)} to listen")
    return {flag: listening[address] for flag, address in links.items()}


def start_order(pods: Sequence[dict[str, Any]], grpc_port: int) -> list[dict[str, Any]]:
    """`pods`, each after the pods it links to: a chain starts from its last stage, so
    that every stage names a worker that already listens. Unlinked pods keep their order."""
    by_address = {pod_address(pod, grpc_port): pod for pod in pods}
    ordered: list[dict[str, Any]] = []
    seen: set[int] = set()

    def visit(pod: dict[str, Any]) -> None:
        if id(pod) in seen:
            return
        seen.add(id(pod))
        for address in pod_links(pod).values():
            if address in by_address:
                visit(by_address[address])
        ordered.append(pod)

    for pod in pods:
        visit(pod)
    return ordered
