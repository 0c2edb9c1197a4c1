"""The gateway's Deployment: `meshnet serve` against the stages, speculating as the recipe
allows."""

from __future__ import annotations

import pytest

from meshnet.api.shardroute import Gateway, Speculation, Stage
from meshnet.reconcile.route.gatewayspec import gateway_deployment
from meshnet.reconcile.route.identity import ROUTE_KEY_PATH
from meshnet.reconcile.route.podspec import RouteRef, WorkerConfig

CONFIG = WorkerConfig(images={"cpu": "worker-cpu:1"}, gateway_image="meshnet/operator:1")
ROUTE = RouteRef("r1", "ml", "uid-1")
STAGES = [Stage.model_validate({"name": f"s{i}", "layers": {"begin": b, "end": e}})
          for i, (b, e) in enumerate(((0, 15), (15, 30)))]


def serve_flags(speculation: Speculation) -> dict[str, str]:
    body = gateway_deployment(ROUTE, STAGES, Gateway(), None, speculation, CONFIG, [1])
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
        body = gateway_deployment(ROUTE, STAGES, Gateway(), None, speculation, CONFIG, [1])
        return str(body["metadata"]["labels"]["meshnet.dev/template-hash"])

    assert template_hash(Speculation()) != template_hash(Speculation(mode="Lookup"))
    assert template_hash(Speculation()) == template_hash(Speculation(max_windows=5))


def replica_flags(epochs: list[int]) -> list[str]:
    body = gateway_deployment(ROUTE, STAGES, Gateway(), None, Speculation(), CONFIG, epochs)
    args = body["spec"]["template"]["spec"]["containers"][0]["args"]
    # then the route's key, proved to every stage
    assert args[args.index("--route-key-file") + 1] == str(ROUTE_KEY_PATH)
    return args[args.index("--drain-seconds") + 2:args.index("--route-key-file")]


def test_the_gateway_is_given_each_replicas_serving_pipeline_and_rolls_when_one_changes(
) -> None:
    assert replica_flags([1]) == ["--stage", "s0-e1.r1-workers.ml.svc:50051",
                                  "--stage", "s1-e1.r1-workers.ml.svc:50051"]
    # mid-rollout: replica 0 already switched to epoch 2, replica 1 still on epoch 1
    assert replica_flags([2, 1]) == [
        "--replica", "s0-e2.r1-workers.ml.svc:50051,s1-e2.r1-workers.ml.svc:50051",
        "--replica", "s0-e1.r1-workers-r1.ml.svc:50051,s1-e1.r1-workers-r1.ml.svc:50051"]
    assert replica_flags([]) == ["--scaled-to-zero"]
    hashes = {gateway_deployment(ROUTE, STAGES, Gateway(), None, Speculation(), CONFIG, e)
              ["metadata"]["labels"]["meshnet.dev/template-hash"]
              for e in ([], [1], [1, 1], [2, 1])}
    assert len(hashes) == 4


def test_an_old_gateway_pod_finishes_its_sessions_for_the_drain_before_it_is_stopped() -> None:
    body = gateway_deployment(ROUTE, STAGES, Gateway(), None, Speculation(), CONFIG, [1], 90)
    args = body["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--drain-seconds") + 1] == "90"
    assert body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 90
    assert body["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_the_gateway_asks_for_the_keys_of_its_secret_mounted_whole() -> None:
    """Mounted whole, not by subPath: the kubelet updates it, and the gateway reads the
    changed file again (a key added or revoked without a roll)."""
    gateway = Gateway.model_validate({"apiKeysSecret": "r1-keys", "hideCachedTokens": True})
    pod = gateway_deployment(ROUTE, STAGES, gateway, None, Speculation(), CONFIG, [1])
    spec = pod["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    keys = args[args.index("--api-keys") + 1]
    assert keys == "/etc/meshnet/api-keys/api-keys"
    assert "--key-cache" not in args and args[args.index("--cached-tokens") + 1] == "hide"
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "api-keys")
    assert mount == {"name": "api-keys", "mountPath": "/etc/meshnet/api-keys", "readOnly": True}
    volume = next(v for v in spec["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == "r1-keys"
    assert volume["secret"]["items"] == [{"key": "api-keys", "path": "api-keys"}]
    plain = gateway_deployment(ROUTE, STAGES, Gateway(), None, Speculation(), CONFIG, [1])
    plain_args = plain["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not {"--api-keys", "--key-cache", "--cached-tokens"} & set(plain_args)
