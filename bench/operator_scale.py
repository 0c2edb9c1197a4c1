"""Operator scale benchmark: N ShardRoutes of S stages reach steady state against the
emulated Kubernetes API (kmock over real HTTP, the real kopf operator), then all are
re-split at once and roll out to a new epoch, followed as a user follows a rollout (every
route updated, then complete; none ever unready, no replica mixing epochs), then stay as
they are for --idle seconds; and the median time of one pure plan() call. Each phase prints
its time, reconciles, operator CPU, status patches, API requests (by verb, the top ones,
the watches) and the handler calls by trigger.

    python bench/operator_scale.py --routes 500 --stages 4
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.devtools.cluster import Emulator, emulated_cluster, mark_pods, operator_process
from meshnet.reconcile.route import (
    Observed,
    WorkerConfig,
    headless_service,
    observe_pod,
    observe_referenced_artifact,
    observe_route,
    plan,
)
from meshnet.reconcile.route.podspec import RouteRef

NS = "bench"
GROUP_PATH = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}"
LAYERS_PER_STAGE = 8
SETTLE_SECONDS = 10.0  # two passes of the per-route daemons (every 5 s)

NOW = datetime(2026, 1, 1, tzinfo=UTC)  # any fixed time: plan() is pure


def artifact(stages: int) -> dict[str, Any]:
    files = [{"name": "model.gguf", "size": 1 << 30,
              "sha256": hashlib.sha256(b"bench").hexdigest()}]
    spec = {"files": files, "source": {"http": {"baseURL": "http://models.local"}},
            "storage": {"pvc": {"claimName": "models"}},
            "expectations": {"blockCount": stages * LAYERS_PER_STAGE}}
    digest = ModelArtifactSpec.model_validate(spec).manifest_digest()
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ModelArtifact",
            "metadata": {"name": "model", "namespace": NS}, "spec": spec,
            "status": {"manifestDigest": digest, "gguf": {"blockCount": stages * LAYERS_PER_STAGE},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Verified"}]}}


def route(name: str, stages: int, drain_seconds: int = 60) -> dict[str, Any]:
    ranges = [(i * LAYERS_PER_STAGE, (i + 1) * LAYERS_PER_STAGE) for i in range(stages)]
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ShardRoute",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"artifactRef": {"name": "model"}, "recipe": {"lane": "cpu"},
                     "rollout": {"drainSeconds": drain_seconds},
                     "stages": [{"name": f"s{i}", "layers": {"begin": b, "end": e}}
                                for i, (b, e) in enumerate(ranges)]}}


@dataclass(frozen=True)
class Progress:
    """Where the routes stand on the way to an epoch, read as `kubectl get sr` and
    `kubectl wait` read a route's status."""

    updated: int  # the spec seen, and every replica served by a ready pipeline of the epoch
    complete: int  # updated, and no pipeline of another epoch left (Progressing False)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def progress(emulator: Emulator, epoch: int, serving: bool) -> Progress:
    """The routes updated to and complete at `epoch`. Fails on a replica whose stages show
    pods of two epochs (never allowed) and, with `serving` (mid-rollout), on a route that is
    not Ready: a rollout keeps every route serving."""
    updated = complete = 0
    for body in emulator.live("meshnet.dev/v1alpha1/shardroutes", NS):
        name, status = body["metadata"]["name"], body.get("status") or {}
        for replica in status.get("replicaStatuses") or [{"replica": 0, "stages": []}]:
            epochs = {s["epoch"] for s in replica["stages"] if "epoch" in s}
            assert len(epochs) <= 1, f"{name} replica {replica['replica']} mixes epochs {epochs}"
        ready = condition(status, "Ready")
        if serving and ready.get("status") != "True":
            raise AssertionError(f"{name} is not Ready mid-rollout: {ready.get('message')}")
        if (status.get("observedGeneration") == body["metadata"].get("generation")
                and status.get("epoch") == epoch
                and status.get("updatedReplicas") == body["spec"].get("replicas", 1)):
            updated += 1
            complete += (condition(status, "Progressing").get("status") == "False"
                         and not status.get("draining"))
    return Progress(updated, complete)


def resplit(stages: int) -> list[dict[str, Any]]:
    """The same layers cut elsewhere: the first stage gives half its layers to the second."""
    cuts = [0, LAYERS_PER_STAGE // 2, *(i * LAYERS_PER_STAGE for i in range(2, stages + 1))]
    return [{"name": f"s{i}", "layers": {"begin": b, "end": e}}
            for i, (b, e) in enumerate(itertools.pairwise(cuts))]


@dataclass
class Phase:
    """What one phase cost: wall time, and the operator's and API server's counters."""

    name: str
    seconds: float
    metrics: dict[str, float]
    calls: Counter[str]
    updated_seconds: float = 0.0  # until every route was updated (complete: `seconds`)
    updated_reconciles: float = 0.0  # reconciles until then

    def report(self, routes: int) -> str:
        reconciles = self.metrics.get(RECONCILES, 0.0)
        by_verb = Counter[str]()
        for call, n in self.calls.items():
            by_verb[call.split()[0]] += n
        verbs = ", ".join(f"{verb} {n}" for verb, n in by_verb.most_common())
        top = ", ".join(f"{call} {n}" for call, n in self.calls.most_common(6))
        watches = ", ".join(f"{call.split()[1]} {n}" for call, n in sorted(self.calls.items())
                            if call.startswith("watch ")) or "none"
        triggers = ", ".join(f"{key.split(QUOTE)[1]} {n:.0f}" for key, n in sorted(
            self.metrics.items(), key=lambda kv: -kv[1]) if key.startswith(TRIGGERS) and n)
        if self.name == "idle":
            writes = sum(n for call, n in self.calls.items()
                         if call.split()[0] not in ("get", "list", "watch"))
            cpu = self.metrics.get(CPU, 0.0)
            return (f"idle: {routes} Ready routes for {self.seconds:.1f} s from"
                    f" {SETTLE_SECONDS:.0f} s after the rollout, nothing changing:"
                    f" {reconciles:.0f} reconciles; operator CPU {cpu:.2f} s"
                    f" ({cpu / self.seconds:.3f} cores); API requests"
                    f" {sum(self.calls.values())} ({verbs or 'none'}), writes {writes}")
        reached = (f"{routes} routes updated to the new epoch in {self.updated_seconds:.1f} s"
                   f" ({self.updated_reconciles / routes:.2f} reconciles per route), complete"
                   f" (old pipelines drained and gone) in {self.seconds:.1f} s, none ever unready"
                   if self.name == "re-split rollout" else
                   f"{routes} routes Ready in {self.seconds:.1f} s")
        return (f"{self.name}: {reached};"
                f" {reconciles:.0f} reconciles ({reconciles / routes:.2f} per route);"
                f" operator CPU {self.metrics.get(CPU, 0.0):.1f} s;"
                f" status patches {self.calls['patch shardroutes/status']};"
                f" API requests {sum(self.calls.values())} ({verbs})\n    top: {top}"
                f"\n    watch requests: {watches}\n    handler calls: {triggers}")


RECONCILES = 'meshnet_reconciles_total{kind="ShardRoute"}'
CPU = "process_cpu_seconds_total"
TRIGGERS = "meshnet_reconcile_triggers_total{"
QUOTE = '"'


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    wanted = (RECONCILES, CPU, TRIGGERS)
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in (await client.get(url)).text.splitlines() if line.startswith(wanted)}


async def follow(emulator: Emulator, routes: int, epoch: int, started: float,
                 timeout: float, serving: bool, stage: str) -> None:
    """Wait until every route is `stage` ("updated" or "complete") at `epoch`, printing
    the progress every few seconds as `kubectl rollout status` does."""
    shown = time.monotonic() - started
    while getattr(now := progress(emulator, epoch, serving), stage) < routes:
        elapsed = time.monotonic() - started
        if elapsed > timeout:
            raise SystemExit(f"after {timeout}s only {now.updated}/{routes} routes updated to"
                             f" epoch {epoch}, {now.complete} complete")
        if elapsed - shown >= 5.0:
            shown = elapsed
            print(f"  {elapsed:5.1f} s: {now.updated} of {routes} routes updated to epoch"
                  f" {epoch}, {now.complete} complete", flush=True)
        await mark_pods(emulator, NS)  # the kubelet: new pods become Ready
        await asyncio.sleep(0.2)


async def phases(routes: int, stages: int, timeout: float, idle: float,
                 drain_seconds: int) -> list[Phase]:
    """Steady state (every route created at once, until all are Ready), then a rollout
    (every route re-split at once, until all are complete at epoch 2, never unready), then
    `idle` seconds in which nothing changes (what the per-route daemons cost). The operator
    runs as `meshnet operator run` in its own process."""
    env = {"MESHNET_WORKER_IMAGE_CPU": "worker:bench", "MESHNET_PIN_DIGEST": "p" * 64,
           "MESHNET_RESYNC_SECONDS": "3600"}
    done: list[Phase] = []
    async with emulated_cluster() as emulator, httpx.AsyncClient() as client:
        body = artifact(stages)
        await emulator.post(f"{GROUP_PATH}/modelartifacts", json={**body, "status": {}})
        await emulator.patch(f"{GROUP_PATH}/modelartifacts/model/status",
                             json={"status": body["status"]})
        with tempfile.TemporaryDirectory() as tmp:
            async with operator_process(emulator, env, Path(tmp)) as metrics_url:
                async def phase(name: str, epoch: int, start: Any) -> None:
                    before, calls = await scrape(client, metrics_url), Counter(emulator.calls)
                    started = time.monotonic()
                    await start()
                    updated, reconciles = 0.0, 0.0
                    if epoch:  # mid-rollout (past epoch 1) every route must serve
                        for stage in ("updated", "complete"):
                            await follow(emulator, routes, epoch, started, timeout,
                                         epoch > 1, stage)
                            if stage == "updated":
                                updated = time.monotonic() - started
                                reconciles = (await scrape(client, metrics_url)).get(
                                    RECONCILES, 0.0) - before.get(RECONCILES, 0.0)
                    seconds = time.monotonic() - started
                    after = await scrape(client, metrics_url)
                    done.append(Phase(name, seconds, {k: v - before.get(k, 0.0)
                                                      for k, v in after.items()},
                                      emulator.calls - calls, updated, reconciles))

                async def create() -> None:
                    for i in range(routes):
                        await emulator.post(f"{GROUP_PATH}/shardroutes",
                                            json=route(f"route-{i:04d}", stages, drain_seconds))

                async def split() -> None:
                    for i in range(routes):
                        await emulator.patch(f"{GROUP_PATH}/shardroutes/route-{i:04d}",
                                             json={"spec": {"stages": resplit(stages)}})

                await phase("steady state", 1, create)
                await phase("re-split rollout", 2, split)
                if idle > 0:
                    await asyncio.sleep(SETTLE_SECONDS)  # the daemons' pass that sees the epoch
                    await phase("idle", 0, lambda: asyncio.sleep(idle))
        pods = list(emulator.live("v1/pods", NS))
        assert len(pods) == routes * stages, f"{len(pods)} pods for {routes} x {stages} stages"
        assert {p["metadata"]["labels"]["meshnet.dev/epoch"] for p in pods} == {"2"}
    return done


def plan_median(stages: int, runs: int) -> float:
    """Median milliseconds of plan() for one converged route (the steady-state case)."""
    config = WorkerConfig(images={"cpu": "worker:bench"}, pin_digest="p" * 64)
    body, art = route("r", stages), artifact(stages)
    body["metadata"]["uid"] = "uid"
    pods: list[dict[str, Any]] = []
    service = headless_service(RouteRef("r", NS, "uid"), config)["metadata"]["labels"]
    service_hash = service["meshnet.dev/template-hash"]
    for _ in range(3):  # converge: create pods, mark them ready, store the status
        observed = Observed(observe_route(body), tuple(p for p in map(observe_pod, pods) if p),
                            services={0: service_hash}, artifact=observe_referenced_artifact(art))
        result = plan(observed, config, NOW)
        for action in result.actions:
            obj = getattr(action, "obj", None)
            if obj and obj["kind"] == "Pod":
                pods.append({**obj, "status": {"conditions": [{"type": "Ready",
                                                               "status": "True"}]}})
        if result.status is not None:
            body["status"] = result.status
    observed = Observed(observe_route(body), tuple(p for p in map(observe_pod, pods) if p),
                        services={0: service_hash}, artifact=observe_referenced_artifact(art))
    assert plan(observed, config, NOW).actions == ()  # steady state
    timings = []
    for _ in range(runs):
        t0 = time.perf_counter()
        plan(observed, config, NOW)
        timings.append((time.perf_counter() - t0) * 1000)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", type=int, default=500)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--plan-runs", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--idle", type=float, default=20.0,
                        help="seconds of nothing changing after the rollout (0: no idle phase)")
    parser.add_argument("--drain-seconds", type=int, default=10,
                        help="the routes' spec.rollout.drainSeconds: the emulated stage pods"
                             " run no worker, so none answers that its sessions ended and a"
                             " replaced pipeline drains this long before it is deleted")
    args = parser.parse_args()
    if args.stages < 2:  # the re-split gives half the first stage's layers to the second
        parser.error("--stages must be at least 2: the rollout re-splits two stages")
    median = plan_median(args.stages, args.plan_runs)
    print(f"plan() median: {median:.3f} ms for one {args.stages}-stage route"
          f" ({args.plan_runs} runs)")
    print(f"{args.routes} ShardRoutes x {args.stages} stages ({args.routes * args.stages} pods),"
          f" drainSeconds {args.drain_seconds}")
    for result in asyncio.run(phases(args.routes, args.stages, args.timeout, args.idle,
                                     args.drain_seconds)):
        print(result.report(args.routes))
    sys.exit(0 if median < 5.0 else 1)


if __name__ == "__main__":
    main()
