"""An emulated Kubernetes API (kmock's KubernetesEmulator over real HTTP) declaring what
the operator and kopf need, plus a kubelet stand-in that marks stage pods ready."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import socket
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import kmock

from meshnet.api import GROUP, VERSION, labels
from meshnet.devtools.scale import object_patch, scale_of, scale_paths
from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator.kube import Connection
from meshnet.operator.run import run
from meshnet.operator.settings import OperatorSettings
from meshnet.timestamps import now_rfc3339

ALL_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]
VERBS = {kmock.action.FETCH: "get", kmock.action.LIST: "list", kmock.action.WATCH: "watch",
         kmock.action.CREATE: "create", kmock.action.UPDATE: "patch",
         kmock.action.DELETE: "delete"}
RESOURCES: dict[str, dict[str, Any]] = {
    f"{GROUP}/{VERSION}/shardroutes": {"kind": "ShardRoute", "namespaced": True,
                                       "subresources": ["status", "scale"],
                                       "shortnames": ["sr"]},
    f"{GROUP}/{VERSION}/modelartifacts": {"kind": "ModelArtifact", "namespaced": True,
                                          "subresources": ["status"], "shortnames": ["ma"]},
    "v1/pods": {"kind": "Pod", "namespaced": True, "subresources": ["status"]},
    "v1/services": {"kind": "Service", "namespaced": True},
    "apps/v1/deployments": {"kind": "Deployment", "namespaced": True,
                            "subresources": ["status"]},
    "v1/events": {"kind": "Event", "namespaced": True},
    "v1/secrets": {"kind": "Secret", "namespaced": True},
    "networking.k8s.io/v1/networkpolicies": {"kind": "NetworkPolicy", "namespaced": True},
    # kopf only starts watching once it can scan these two.
    "apiextensions.k8s.io/v1/customresourcedefinitions": {"kind": "CustomResourceDefinition",
                                                          "namespaced": False},
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
}


WRITE_ACTIONS = (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE)


class Emulator(kmock.KubernetesEmulator):
    """The emulator plus the metadata an API server fills in: uid, creationTimestamp,
    generateName, resourceVersion, and a generation that moves with the spec; the scale
    subresource of the CRDs that declare one (GET and merge PATCH of an autoscaling/v1
    Scale, as `kubectl scale` and an HPA use it); `calls` counts the requests by verb and
    resource (what a benchmark or a test reports)."""

    _serial = itertools.count(1)

    async def _handle(self, request: Any) -> Any:
        # kmock keeps every request for assertions and matches each new one against that
        # history (quadratic at scale); we assert on objects, so keep only those in flight.
        self._in_flight.add(id(request))
        if request.resource is not None:
            if request.action == kmock.action.WATCH:
                self.watched.add(request.resource.plural)
            target = "/".join(filter(None, (request.resource.plural, request.subresource)))
            verb = VERBS.get(request.action) or str(request.method.value).lower()
            self.calls[f"{verb} {target}"] += 1
        self._requests[:] = [r for r in self._requests if id(r) in self._in_flight]
        try:
            return await self._handle_k8s(request)
        finally:
            self._in_flight.discard(id(request))

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._in_flight: set[int] = set()
        self.watched: set[str] = set()  # plurals someone watches (kopf, once it is serving)
        self.calls: collections.Counter[str] = collections.Counter()  # "patch pods/status": n
        self.scaled = scale_paths()  # plural -> its CRD's scale subresource
        # called after every write, so a test can sample the cluster at each change
        self.on_write: list[Callable[[], None]] = []

    async def _handle_k8s(self, request: Any) -> Any:
        data = request.data
        if self._scales(request) and request.action == kmock.action.UPDATE:
            try:  # a write of the Scale is a write of the object's replicas field
                translated = object_patch(request.resource.plural, data or {})
            except ValueError as exc:
                raise kmock.KubernetesError(status=422, reason="Invalid",
                                            message=str(exc)) from exc
            data.clear()
            data.update(translated)
        if request.resource is not None and request.action == kmock.action.CREATE \
                and isinstance(data, dict):
            self._on_create(data.setdefault("metadata", {}))
        elif request.resource is not None and request.action == kmock.action.UPDATE:
            self._on_update(request, data)
        try:
            response = await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:  # optimistic concurrency lost: 422
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
        if request.resource is not None and request.action in WRITE_ACTIONS:
            for watcher in self.on_write:
                watcher()
        return response

    def _on_update(self, request: Any, data: Any) -> None:
        version = str(next(self._serial))
        if isinstance(data, list):  # a JSON patch (kopf tests resourceVersion first)
            data.append({"op": "replace", "path": "/metadata/resourceVersion", "value": version})
        elif isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            asked = meta.get("resourceVersion")
            current = self._named(request)
            if asked is not None and current is not None and \
                    asked != (current.raw.get("metadata") or {}).get("resourceVersion"):
                # a write made from a stale read: refused, as the API server does
                raise kmock.KubernetesError(status=409, reason="Conflict", message=(
                    "the object has been modified; please apply your changes to the latest"
                    " version and try again"))
            meta["resourceVersion"] = version
            if "spec" in data and request.subresource in (None, "scale"):
                current = self.objects[request.resource, request.namespace, request.name]
                meta["generation"] = (current.get("metadata") or {}).get("generation", 1) + 1

    def _on_create(self, meta: dict[str, Any]) -> None:
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._serial):05d}"
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._serial))
        meta.setdefault("creationTimestamp",
                        now_rfc3339())

    # kmock finds an object by scanning every stored object; at benchmark scale (thousands
    # of pods and events) that dominates, so named requests use the dictionary directly.
    def _named(self, request: Any, name: str | None = None) -> Any:
        key = (request.resource, request.namespace, name or request.name)
        try:
            return self.objects[key]
        except KeyError:
            return None

    async def _serve_fetch(self, request: Any) -> Any:
        obj = self._named(request)
        if obj is None or obj.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return scale_of(request.resource.plural, obj.raw) if self._scales(request) else obj.raw

    async def _serve_create(self, request: Any) -> Any:
        meta = request.data.get("metadata", {})
        key = (request.resource, request.namespace or meta.get("namespace"), meta.get("name"))
        return self.objects[key].raw

    async def _serve_update(self, request: Any) -> Any:
        raw = self._named(request).last.raw
        return scale_of(request.resource.plural, raw) if self._scales(request) else raw

    def _scales(self, request: Any) -> bool:
        """A request to the scale subresource of a resource whose CRD declares one."""
        return request.resource is not None and request.subresource == "scale" \
            and request.resource.plural in self.scaled

    async def _serve_delete(self, request: Any) -> Any:
        return self._named(request).last.raw

    async def _serve_list(self, request: Any) -> Any:
        """kmock's list plus the kind and apiVersion that kubectl insists on."""
        payload: dict[str, Any] = dict(await super()._serve_list(request))  # type: ignore[arg-type]
        resource = request.resource
        group_version = f"{resource.group}/{resource.version}".lstrip("/")
        kind = RESOURCES.get(f"{group_version}/{resource.plural}", {}).get("kind", "")
        return {"apiVersion": group_version, "kind": f"{kind}List", **payload}

    def live(self, resource: str, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        """Current bodies of one resource ('v1/pods' or 'group/version/plural')."""
        group_version, plural = resource.rsplit("/", 1)
        group, _, version = group_version.rpartition("/")
        for (res, ns, _), obj in list(self.objects.items()):
            if (res.group, res.version, res.plural) == (group, version, plural) \
                    and not obj.deleted and (namespace is None or ns == namespace):
                yield dict(obj.raw)


@asynccontextmanager
async def emulated_cluster() -> AsyncIterator[Emulator]:
    """An emulator on a random 127.0.0.1 port with every resource the operator touches."""
    async with Emulator() as emulator, kmock.Server(emulator):
        for resource, info in RESOURCES.items():
            emulator.resources[resource] = kmock.ResourceInfo(verbs=ALL_VERBS, **info)
        yield emulator


@asynccontextmanager
async def running_operator(emulator: Emulator, settings: OperatorSettings,
                           metrics: OperatorMetrics | None = None) -> AsyncIterator[None]:
    """The real operator (kopf and all) against the emulator, stopped on exit. It runs in a
    thread of its own: on shutdown kopf cancels every task of its loop it did not start."""
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []
    connection = Connection(server=str(emulator.url).rstrip("/"))

    def serve() -> None:
        try:
            asyncio.run(run(settings, connection, stop_flag=stop, ready_flag=ready,
                            metrics=metrics))
        except BaseException as exc:  # reported to the test below
            failure.append(exc)

    thread = threading.Thread(target=serve, name="meshnet-operator", daemon=True)
    thread.start()
    await eventually(lambda: ready.is_set() or not thread.is_alive(), 30, "the operator")
    if failure:
        raise failure[0]
    try:
        yield
    finally:
        stop.set()
        await eventually(lambda: not thread.is_alive(), 30, "the operator to stop")


@asynccontextmanager
async def operator_process(emulator: Emulator, env: dict[str, str],
                           workdir: Path) -> AsyncIterator[str]:
    """`meshnet operator run --kubeconfig` against the emulator in its own process (its own
    GIL: the benchmark's emulator and kubelet stay responsive). Yields the metrics URL."""
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": str(emulator.url).rstrip("/")}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator"}}],
    }))
    metrics, health = _free_port(), _free_port()
    env = {**os.environ, **env, "MESHNET_METRICS_PORT": str(metrics),
           "MESHNET_HEALTH_PORT": str(health)}
    with (workdir / "operator.log").open("w") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from meshnet.cli.main import main; main()",
            "operator", "run", "--kubeconfig", str(kubeconfig), env=env, stdout=log, stderr=log)
        try:
            async with httpx.AsyncClient() as client:
                await _wait_healthy(client, f"http://127.0.0.1:{health}/healthz", process)
            yield f"http://127.0.0.1:{metrics}/metrics"
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), timeout=30)


async def _wait_healthy(client: httpx.AsyncClient, url: str,
                        process: asyncio.subprocess.Process) -> None:
    for _ in range(600):
        if process.returncode is not None:
            raise RuntimeError(f"the operator exited with {process.returncode}")
        try:
            if (await client.get(url)).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError("the operator did not become healthy in 60 s")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def mark_pods(emulator: Emulator, namespace: str, *, ready: bool = True,
                    waiting: str | None = None,
                    select: Callable[[dict[str, Any]], bool] = lambda _: True) -> int:
    """Do the kubelet's part for stage pods: report them Running (and Ready) over HTTP."""
    count = 0
    for pod in emulator.live("v1/pods", namespace):
        meta = pod["metadata"]
        if labels.STAGE not in (meta.get("labels") or {}) or not select(pod):
            continue
        if _pod_ready(pod) == ready and not waiting:
            continue
        waits = {"reason": waiting, "message": "back-off restarting"}
        state = {"waiting": waits} if waiting else {}
        status = {"phase": "Running", "podIP": "10.0.0.1",
                  "conditions": [{"type": "Ready", "status": str(ready)}],
                  "containerStatuses": [{"name": "worker", "restartCount": 2 if waiting else 0,
                                         "ready": ready, "state": state}]}
        await emulator.patch(f"/api/v1/namespaces/{namespace}/pods/{meta['name']}/status",
                             json={"status": status})
        count += 1
    return count


def _pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def eventually(check: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    """Poll `check` until it holds; fail with `what` after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(0.05)
