"""The gateway command lines both backends render, each through `meshnet serve`'s own
parser (the `meshnet` click group, as the pod's container and `meshnet up` invoke it;
nothing is served): every route the planner can plan (stage count, replicas and a
rollout's mixed epochs, speculation, TLS, maxWaiting and drain at their bounds) gets a
gateway, in a pod and under `meshnet up`, with options serve takes, and both backends give
it the same options but for where it runs."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product
from pathlib import Path
from typing import Any, get_args

import click
import pytest

from meshnet.api.shardroute import ShardRouteSpec, SpeculationMode
from meshnet.cli.main import cli
from meshnet.cli.serve import replica_source
from meshnet.cli.up import local_gateway_command
from meshnet.reconcile.route.gatewayspec import gateway_deployment
from meshnet.reconcile.route.identity import ROUTE_KEY_PATH, IssuedIdentity, link_tls
from meshnet.reconcile.route.podspec import TLS_DIR, RouteRef, WorkerConfig

ROUTE = RouteRef("r1", "ml", "uid-1")
CONFIG = WorkerConfig(images={"cpu": "worker-cpu:1"}, gateway_image="meshnet/operator:1")
SPANS = {1: [(0, 30)], 2: [(0, 15), (15, 30)], 3: [(0, 10), (10, 20), (20, 30)]}
# Which epoch serves each replica: scaled to zero, one, a rollout half done, three.
EPOCHS: list[list[int]] = [[], [1], [2, 1], [1, 1, 1]]
TLS: list[dict[str, Any] | None] = [
    None, {"mode": "Disabled"}, {"secretName": "t"},
    {"mode": "Secret", "secretName": "t", "requireClientCert": True}]
# The identity the operator issues a route without spec.tls (or with mode Operator).
IDENTITY = IssuedIdentity("r1-identity", "2026-12-07T00:00:00Z")
# The fields that reach the gateway's command line, at their defaults and at their bounds.
BOUNDS: list[dict[str, Any]] = [
    {},
    {"gateway": {"maxWaiting": 0}, "rollout": {"drainSeconds": 0},
     "speculation": {"maxDrafts": 1, "maxWindows": 1}},
    {"gateway": {"maxWaiting": 100000}, "rollout": {"drainSeconds": 86400},
     "speculation": {"maxDrafts": 7, "maxWindows": 8}},
    {"gateway": {"apiKeysSecret": "keys", "shareCacheAcrossKeys": True,
                 "hideCachedTokens": True}},
    {"gateway": {"apiKeysSecret": "keys"}},
]


def planned_routes() -> Iterator[tuple[dict[str, Any], list[int]]]:
    """ShardRoute documents in the product of the planner's inputs, each with the epochs
    of the pipelines serving its replicas."""
    for count, mode, tls, bounds, epochs in product(
            SPANS, get_args(SpeculationMode), TLS, BOUNDS, EPOCHS):
        spec = {
            "artifactRef": {"name": "m"},
            "replicas": len(epochs),
            "stages": [{"name": f"s{i}", "layers": {"begin": b, "end": e}}
                       for i, (b, e) in enumerate(SPANS[count])],
            "recipe": {"speculation": {**bounds.get("speculation", {}), "mode": mode}},
            **{key: bounds[key] for key in ("gateway", "rollout") if key in bounds},
            **({"tls": tls} if tls else {}),
        }
        yield {"metadata": {"name": ROUTE.name, "namespace": ROUTE.namespace},
               "spec": spec}, epochs


def pod_args(route: dict[str, Any], epochs: list[int]) -> list[str]:
    """The gateway container's args the operator renders (as the planner calls it)."""
    spec = ShardRouteSpec.model_validate(route["spec"])
    body = gateway_deployment(ROUTE, spec.stages, spec.gateway, link_tls(spec.tls, IDENTITY),
                              spec.recipe.speculation, CONFIG, epochs,
                              spec.rollout.drain_seconds, IDENTITY.secret_name)
    return list(body["spec"]["template"]["spec"]["containers"][0]["args"])


def local_args(route: dict[str, Any]) -> list[str]:
    """What `meshnet up --serve 127.0.0.1:8000` runs after `python -m meshnet.cli` (with
    `--api-keys FILE` where the route's gateway asks for keys: the Secret's stand-in)."""
    keys = Path("/srv/keys") if route["spec"].get("gateway", {}).get("apiKeysSecret") else None
    return local_gateway_command(route, "127.0.0.1:8000", keys,
                                 Path("/srv/route.key")).args(parent_pid=4242)


def rendered_argvs() -> dict[str, list[tuple[str, ...]]]:
    routes = list(planned_routes())
    pods = {tuple(pod_args(route, epochs)) for route, epochs in routes}
    local = {tuple(local_args(route)) for route, _ in routes
             if route["spec"].get("tls", {}).get("mode", "Disabled") == "Disabled"}
    return {"pod": sorted(pods), "local": sorted(local)}


def serve_refusal(argv: tuple[str, ...], tls_dir: Path) -> str | None:
    """`meshnet serve`'s refusal of `argv` (after the `meshnet` program name), or None when
    it would start with it. The TLS files it reads where a pod mounts them are looked for
    in `tls_dir` (they must exist)."""
    args = [arg.replace(TLS_DIR, str(tls_dir)) for arg in argv]
    try:
        command = cli.get_command(click.Context(cli), args[0])  # the `meshnet` group's
        if command is None:
            return f"no command {args[0]!r}"
        with command.make_context(args[0], args[1:]) as serve:
            params = serve.params
            replica_source(params["route_name"], params["stages"], params["replicas"],
                           params["scaled_to_zero"])
    except click.ClickException as exc:
        return exc.format_message()
    return None


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / name).write_text("")
    return tmp_path


@pytest.mark.parametrize("backend", ["pod", "local"])
def test_every_gateway_command_line_a_backend_renders_is_one_serve_parses(
        backend: str, tls_dir: Path) -> None:
    argvs = rendered_argvs()[backend]
    assert len(argvs) > (100 if backend == "pod" else 10)  # the product above, not a handful
    refusals = [(argv, why) for argv in argvs if (why := serve_refusal(argv, tls_dir))]
    assert not refusals, "\n".join(f"{' '.join(argv)}\n  -> {why}" for argv, why in refusals[:5])


# Options that say where the gateway runs (its address, how it finds the replicas, its
# TLS and API keys files where they are mounted, the process it stops with), which each
# backend renders its own way.
PLACE = {"--listen", "--route", "--stage", "--replica", "--scaled-to-zero", "--tls-ca",
         "--tls-cert", "--tls-key", "--exit-with-parent", "--api-keys", "--route-key-file"}


def option_values(argv: list[str]) -> dict[str, str]:
    """The options of a rendered `serve` command line but the placement ones (the only
    ones that repeat, or take no value)."""
    assert argv[0] == "serve"
    values: dict[str, str] = {}
    args = iter(argv[1:])
    for option in args:
        if option == "--scaled-to-zero":
            continue
        value = next(args)
        if option not in PLACE:
            assert option not in values, argv
            values[option] = value
    return values


def test_both_backends_give_a_gateway_the_same_options_but_for_where_it_runs() -> None:
    compared = 0
    for route, epochs in planned_routes():
        if "tls" in route["spec"]:  # the local backend refuses TLS (no Secret to mount)
            continue
        pod, local = pod_args(route, epochs), local_args(route)
        assert option_values(pod) == option_values(local), route
        assert ("--api-keys" in pod) == ("--api-keys" in local)
        # the route's key: its Secret's file in a pod, the one `meshnet up` wrote here
        assert pod[pod.index("--route-key-file") + 1] == str(ROUTE_KEY_PATH)
        assert local[local.index("--route-key-file") + 1] == "/srv/route.key"
        assert local[local.index("--route") + 1] == "r1"  # followed in this machine's registry
        compared += 1
    assert compared > 100


def test_the_check_refuses_a_misspelt_option_and_a_bad_value_with_the_parsers_message(
        tls_dir: Path) -> None:
    route, epochs = next(planned_routes())
    argv = tuple(pod_args(route, epochs))
    assert serve_refusal(argv, tls_dir) is None
    misspelt = serve_refusal((*argv, "--max-wating", "3"), tls_dir)
    assert misspelt is not None and "No such option" in misspelt and "--max-wating" in misspelt
    out_of_range = serve_refusal((*argv, "--windows", "0"), tls_dir)
    assert out_of_range is not None and "'--windows': 0 is not in the range" in out_of_range
    assert serve_refusal((*argv, "--route", "r1"), tls_dir) == (
        "give one of --route NAME, one --stage per stage, one --replica per replica, or "
        "--scaled-to-zero")
