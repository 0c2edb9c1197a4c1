"""The worker command lines both backends render, each through the built worker's own
parser (`meshnet-shard-worker --check-args`: no model is loaded, no port opened): every
route the planner can plan (topology, stage count, speculation, TLS, GPU offload, replica,
recipe bounds) starts, in a pod and under `meshnet up`, with flags the worker takes, and
both backends give it the same flags but for where it runs."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import product
from pathlib import Path
from typing import Any, get_args

import pytest

from meshnet.api.common import Topology
from meshnet.api.shardroute import Recipe, SpeculationMode, Stage
from meshnet.local.stages import launch_spec
from meshnet.reconcile.route.identity import ROUTE_KEY_PATH, LinkTls
from meshnet.reconcile.route.planner import stage_worker
from meshnet.reconcile.route.podspec import RouteRef, WorkerConfig, worker_args
from meshnet.reconcile.route.workerspec import Identities, WorkerSpec

ROUTE = RouteRef("r1", "ml", "uid-1")
CONFIG = WorkerConfig(pin_digest="p")
IDENTITIES = Identities("a" * 64, "b" * 64, "c" * 64)
SPANS = {1: [(0, 30)], 2: [(0, 15), (15, 30)], 3: [(0, 10), (10, 20), (20, 30)]}
MODES = list(get_args(SpeculationMode))
TLS = [None, LinkTls("t", False), LinkTls("t", True), LinkTls("t", True, "2026-12-07T00:00:00Z")]
# The recipe fields that reach the command line, at their defaults and at their bounds.
RECIPE_BOUNDS: list[dict[str, Any]] = [
    {},
    {"boundaryDtype": "bf16", "contextLength": 1048576, "sessionSlots": 1024,
     "speculation": {"maxDrafts": 7, "maxWindows": 8}, "batching": "Throughput"},
    {"boundaryDtype": "f16", "contextLength": 16, "sessionSlots": 1,
     "speculation": {"maxDrafts": 1, "maxWindows": 1}},
]


def planned_workers() -> Iterator[WorkerSpec]:
    """Every stage's worker of every route in the product of the planner's inputs."""
    for topology, count, mode, tls, offload, replica, bounds in product(
            get_args(Topology), SPANS, MODES, TLS, (False, True), (0, 1), RECIPE_BOUNDS):
        gpus = {"resources": {"gpus": 1}} if offload else {}
        stages = [Stage.model_validate({"name": f"s{i}", "layers": {"begin": b, "end": e}, **gpus})
                  for i, (b, e) in enumerate(SPANS[count])]
        recipe = Recipe.model_validate({
            **bounds, "topology": topology, "lane": "cuda" if offload else "cpu",
            "speculation": {**bounds.get("speculation", {}), "mode": mode}})
        for index in range(count):
            yield stage_worker(stages, index, recipe, tls, 3, IDENTITIES, "m-00001-of-00002.gguf",
                               "ml/r1", replica=replica,
                               drafter_file="drafter.gguf" if mode == "DSpark" else None,
                               compress_boundaries=replica == 1)  # (replica 1's pack)


def local_args(worker: WorkerSpec) -> list[str]:
    """What `meshnet up` starts for `worker` (its stages on loopback ports)."""
    links = {name: f"127.0.0.1:{50100 + i}" for i, name in enumerate(worker.links.names())}
    return launch_spec(worker, Path("/tmp/models/m-00001-of-00002.gguf"), 2, links,
                       Path("/tmp/meshnet/route-keys/r1.key")).args()


def rendered_argvs() -> dict[str, list[tuple[str, ...]]]:
    workers = list(planned_workers())
    pods = {tuple(worker_args(w, ROUTE, CONFIG)) for w in workers}
    local = {tuple(local_args(w)) for w in workers if w.tls is None}
    return {"pod": sorted(pods), "local": sorted(local)}


def check_args(binary: Path, argv: tuple[str, ...]) -> str | None:
    """The worker's refusal of `argv`, or None when it would start with it."""
    checked = subprocess.run([str(binary), "--check-args", *argv], capture_output=True,
                             text=True, timeout=30)
    if checked.returncode == 0 and not checked.stdout and not checked.stderr:
        return None
    return f"exit {checked.returncode}: {checked.stderr.strip() or checked.stdout.strip()}"


@pytest.mark.parametrize("backend", ["pod", "local"])
def test_every_worker_command_line_a_backend_renders_is_one_the_worker_parses(
    backend: str, shard_worker: Path,
) -> None:
    argvs = rendered_argvs()[backend]
    assert len(argvs) > 100  # the product above, not a handful
    with ThreadPoolExecutor(4) as pool:
        refusals = [(argv, why) for argv, why in zip(
            argvs, pool.map(lambda argv: check_args(shard_worker, argv), argvs), strict=True)
            if why is not None]
    assert not refusals, "\n".join(f"{' '.join(argv)}\n  -> {why}" for argv, why in refusals[:5])


# Flags that say where a worker runs (its files, ports, links' addresses, this machine's
# threads and supervisor), which each backend renders its own way.
PLACE = {"--model", "--listen", "--metrics-listen", "--threads", "--batch", "--exit-with-parent",
         "--next-stage", "--ring-last", "--drafter-model", "--route-key-file"}


def flag_values(argv: list[str]) -> dict[str, str]:
    assert len(argv) % 2 == 0  # every rendered flag takes a value
    return dict(zip(argv[::2], argv[1::2], strict=True))


def test_both_backends_give_a_worker_the_same_flags_but_for_where_it_runs() -> None:
    compared = 0
    for worker in planned_workers():
        if worker.tls is not None:  # the local backend refuses TLS (no Secret to mount)
            continue
        pod = flag_values(worker_args(worker, ROUTE, CONFIG))
        local = flag_values(local_args(worker))
        # every stage holds its route's key: the Secret's file in a pod, up's own here
        assert pod["--route-key-file"] == str(ROUTE_KEY_PATH), worker
        assert local["--route-key-file"] == "/tmp/meshnet/route-keys/r1.key", worker
        assert {k: v for k, v in pod.items() if k not in PLACE} == \
            {k: v for k, v in local.items() if k not in PLACE}, worker
        assert pod.keys() & PLACE - {"--threads", "--batch", "--exit-with-parent"} == \
            local.keys() & PLACE - {"--threads", "--batch", "--exit-with-parent"}, worker
        compared += 1
    assert compared > 100


def test_the_check_refuses_a_misspelt_flag_and_a_bad_value_with_the_parsers_message(
    shard_worker: Path,
) -> None:
    argv = tuple(worker_args(next(planned_workers()), ROUTE, CONFIG))
    assert check_args(shard_worker, argv) is None
    assert check_args(shard_worker, (*argv, "--next-stgae", "h:1")) == \
        "exit 2: error: unknown flag --next-stgae"
    assert check_args(shard_worker, (*argv, "--slots", "0")) == \
        "exit 2: error: bad value for --slots: '0'"
    assert check_args(shard_worker, (*argv, "--ring-last", "h:1")) == (
        "exit 2: error: --ring-last closes a chain: it needs --next-stage (the first stage's "
        "successor)")


def test_recipe_batching_throughput_renders_the_workers_flag_on_every_stage() -> None:
    stages = [Stage.model_validate({"name": f"s{i}", "layers": {"begin": b, "end": e}})
              for i, (b, e) in enumerate(SPANS[2])]

    def argvs(recipe: dict[str, Any]) -> list[list[str]]:
        planned = Recipe.model_validate(recipe)
        workers = [stage_worker(stages, i, planned, None, 3, IDENTITIES, "m.gguf", "ml/r1")
                   for i in range(len(stages))]
        return [worker_args(w, ROUTE, CONFIG) for w in workers] + \
               [local_args(w) for w in workers]

    for argv in argvs({"batching": "Throughput"}):
        assert flag_values(argv)["--batching"] == "throughput"
    for argv in argvs({}) + argvs({"batching": "Exact"}):
        assert "--batching" not in argv  # the worker's default: exact


def test_a_stage_told_to_pack_renders_the_flag_only_when_it_relays_boundaries() -> None:
    stages = [Stage.model_validate({"name": f"s{i}", "layers": {"begin": b, "end": e}})
              for i, (b, e) in enumerate(SPANS[3])]
    for topology, packing in [("chain", [True, True, False]), ("ring", [True, True, False]),
                              ("hub", [False, False, False])]:
        recipe = Recipe.model_validate({"topology": topology})
        workers = [stage_worker(stages, i, recipe, None, 3, IDENTITIES, "m.gguf", "ml/r1",
                                compress_boundaries=True) for i in range(len(stages))]
        for render in (lambda w: worker_args(w, ROUTE, CONFIG), local_args):
            rendered = [flag_values(render(w)).get("--boundary-compression") for w in workers]
            # the last stage and a hub's stages relay nothing: nothing to pack
            assert rendered == ["shuffle-lz4" if p else None for p in packing], topology
    plain = stage_worker(stages, 0, Recipe(), None, 3, IDENTITIES, "m.gguf", "ml/r1")
    assert "--boundary-compression" not in worker_args(plain, ROUTE, CONFIG)
