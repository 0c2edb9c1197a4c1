"""Operator scale benchmark: N ShardRoutes of S stages reach steady state against the
emulated Kubernetes API (kmock over real HTTP, the real kopf operator), and the median
time of one pure plan() call.

    python bench/operator_scale.py --routes 500 --stages 4
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.devtools.cluster import Emulator, emulated_cluster, mark_pods, operator_process
from meshnet.reconcile import (
    Observed,
    WorkerConfig,
    headless_service,
    observe_artifact,
    observe_pod,
    observe_route,
    plan,
)
from meshnet.reconcile.podspec import RouteRef

NS = "bench"
GROUP_PATH = f"/apis/meshnet.dev/v1alpha1/namespaces/{NS}"
LAYERS_PER_STAGE = 8


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


def route(name: str, stages: int) -> dict[str, Any]:
    ranges = [(i * LAYERS_PER_STAGE, (i + 1) * LAYERS_PER_STAGE) for i in range(stages)]
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ShardRoute",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"artifactRef": {"name": "model"}, "recipe": {"lane": "cpu"},
                     "stages": [{"name": f"s{i}", "layers": {"begin": b, "end": e}}
                                for i, (b, e) in enumerate(ranges)]}}


def ready_routes(emulator: Emulator) -> int:
    count = 0
    for body in emulator.live("meshnet.dev/v1alpha1/shardroutes", NS):
        conditions = (body.get("status") or {}).get("conditions") or []
        count += any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return count


async def steady_state(routes: int, stages: int, timeout: float) -> tuple[float, str]:
    """Seconds from the first create until every route is Ready, and the operator's
    reconcile counter. The operator runs as `meshnet operator run` in its own process."""
    env = {"MESHNET_WORKER_IMAGE_CPU": "worker:bench", "MESHNET_PIN_DIGEST": "p" * 64,
           "MESHNET_RESYNC_SECONDS": "3600"}
    async with emulated_cluster() as emulator:
        body = artifact(stages)
        await emulator.post(f"{GROUP_PATH}/modelartifacts", json={**body, "status": {}})
        await emulator.patch(f"{GROUP_PATH}/modelartifacts/model/status",
                             json={"status": body["status"]})
        with tempfile.TemporaryDirectory() as tmp:
            async with operator_process(emulator, env, Path(tmp)) as metrics_url:
                started = time.monotonic()
                for i in range(routes):
                    await emulator.post(f"{GROUP_PATH}/shardroutes",
                                        json=route(f"route-{i:04d}", stages))
                while (ready := ready_routes(emulator)) < routes:
                    if time.monotonic() - started > timeout:
                        raise SystemExit(f"only {ready}/{routes} routes Ready after {timeout}s")
                    await mark_pods(emulator, NS)  # the kubelet: new pods become Ready
                    await asyncio.sleep(0.2)
                elapsed = time.monotonic() - started
                async with httpx.AsyncClient() as client:
                    text = (await client.get(metrics_url)).text
        pods = sum(1 for _ in emulator.live("v1/pods", NS))
        assert pods == routes * stages, f"{pods} pods for {routes} routes of {stages} stages"
        reconciles = next((line.split()[-1] for line in text.splitlines()
                           if line.startswith("meshnet_reconciles_total{")), "?")
        return elapsed, reconciles


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
                            service_hash=service_hash, artifact=observe_artifact(art))
        result = plan(observed, config, "2026-01-01T00:00:00Z")
        for action in result.actions:
            obj = getattr(action, "obj", None)
            if obj and obj["kind"] == "Pod":
                pods.append({**obj, "status": {"conditions": [{"type": "Ready",
                                                               "status": "True"}]}})
        if result.status is not None:
            body["status"] = result.status
    observed = Observed(observe_route(body), tuple(p for p in map(observe_pod, pods) if p),
                        service_hash=service_hash, artifact=observe_artifact(art))
    assert plan(observed, config, "2026-01-01T00:00:00Z").actions == ()  # steady state
    timings = []
    for _ in range(runs):
        t0 = time.perf_counter()
        plan(observed, config, "2026-01-01T00:00:00Z")
        timings.append((time.perf_counter() - t0) * 1000)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", type=int, default=500)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--plan-runs", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    median = plan_median(args.stages, args.plan_runs)
    print(f"plan() median: {median:.3f} ms for one {args.stages}-stage route"
          f" ({args.plan_runs} runs)")
    seconds, reconciles = asyncio.run(steady_state(args.routes, args.stages, args.timeout))
    print(f"steady state: {args.routes} ShardRoutes x {args.stages} stages"
          f" ({args.routes * args.stages} pods) Ready in {seconds:.1f} s,"
          f" {reconciles} reconciles")
    sys.exit(0 if median < 5.0 else 1)


if __name__ == "__main__":
    main()
