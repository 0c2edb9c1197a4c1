"""The gateway's Deployment: `meshnet serve` against the stages, speculating as the recipe
allows."""

from __future__ import annotations

import pytest

from meshnet.api.shardroute import Gateway, Speculation, Stage
from meshnet.reconcile.route.gatewayspec import gateway_deployment
from meshnet.reconcile.route.podspec import RouteRef, WorkerConfig

CONFIG = WorkerConfig(images={"cpu": "worker-cpu:1"}, gateway_image="meshnet/operator:1")
ROUTE = RouteRef("r1", "ml", "uid-1")
STAGES = [Stage.model_validate({"name": f"s{i}", "layers": {"begin": b, "end": e}})
          for i, (b, e) in enumerate(((0, 15), (15, 30)))]


def serve_flags(speculation: Speculation) -> dict[str, str]:
    body = gateway_deployment(ROUTE, STAGES, Gateway(), None, speculation, CONFIG)
    args = body["spec"]["template"]["spec"]["containers"][0]["args"][1:]
    return {flag: args[i + 1] for i, flag in enumerate(args)
            if flag in ("--speculate", "--windows", "--drafter")}


@pytest.mark.parametrize(("speculation", "flags"), [
    (Speculation(), {"--speculate": "0", "--windows": "1"}),
    (Speculation(max_drafts=3, max_windows=2), {"--speculate": "0", "--windows": "1"}),
    (Speculation(mode="Lookup"), {"--speculate": "6", "--windows": "4"}),
    (Speculation(mode="Lookup", max_drafts=7, max_windows=8),
     {"--speculate": "7", "--windows": "8"}),
    # the last stage drafts: the gateway's handshake checks that it hosts the drafter
    (Speculation(mode="MTP", max_drafts=3), {"--speculate": "3", "--windows": "4",
                                             "--drafter": "mtp"}),
])
def test_the_gateway_speculates_by_default_as_far_as_the_recipe_allows(
        speculation: Speculation, flags: dict[str, str]) -> None:
    assert serve_flags(speculation) == flags


def test_a_speculation_change_rolls_the_gateway_deployment() -> None:
    def template_hash(speculation: Speculation) -> str:
        body = gateway_deployment(ROUTE, STAGES, Gateway(), None, speculation, CONFIG)
        return str(body["metadata"]["labels"]["meshnet.dev/template-hash"])

    assert template_hash(Speculation()) != template_hash(Speculation(mode="Lookup"))
    assert template_hash(Speculation()) == template_hash(Speculation(max_windows=5))


def replica_flags(replicas: int) -> list[str]:
    body = gateway_deployment(ROUTE, STAGES, Gateway(), None, Speculation(), CONFIG, replicas)
    args = body["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--windows") + 2:]


def test_the_gateway_is_given_every_replicas_stages_and_rolls_when_the_route_scales() -> None:
    assert replica_flags(1) == ["--stage", "s0.r1-workers.ml.svc:50051",
                                "--stage", "s1.r1-workers.ml.svc:50051"]
    assert replica_flags(2) == [
        "--replica", "s0.r1-workers.ml.svc:50051,s1.r1-workers.ml.svc:50051",
        "--replica", "s0.r1-workers-r1.ml.svc:50051,s1.r1-workers-r1.ml.svc:50051"]
    assert replica_flags(0) == ["--scaled-to-zero"]
    hashes = {gateway_deployment(ROUTE, STAGES, Gateway(), None, Speculation(), CONFIG, n)
              ["metadata"]["labels"]["meshnet.dev/template-hash"] for n in (0, 1, 2)}
    assert len(hashes) == 3
