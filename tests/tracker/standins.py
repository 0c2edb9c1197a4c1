"""What a cluster does besides the API server, for the operator tests over kmock: a kubelet
that runs each stage pod as a real worker on its own loopback address (its "pod IP"), and
a Job controller that really runs the certification Job's `meshnet certify`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock

from meshnet.api import labels
from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.certify.job import JOB_NAME_LABEL, TERMINATION_LOG
from meshnet.devtools.cluster import Emulator
from meshnet.local.process import WORKER_ENV_DEFAULTS, WorkerProcess
from meshnet.reconcile.route.identity import stage_server_name
from meshnet.reconcile.route.podspec import MODEL_DIR
from meshnet.route.route_key import RouteSecret
from meshnet.route.stage import TlsFiles

NS = "default"
EXTRA_RESOURCES: dict[str, dict[str, Any]] = {
    "batch/v1/jobs": {"kind": "Job", "namespaced": True, "subresources": ["status"]},
    "v1/nodes": {"kind": "Node", "namespaced": False},
}
VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]


def declare_jobs_and_nodes(emulator: Emulator) -> None:
    for resource, info in EXTRA_RESOURCES.items():
        emulator.resources[resource] = kmock.ResourceInfo(verbs=VERBS, **info)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def artifact(model: Path, name: str = "smollm2") -> dict[str, Any]:
    """A Ready ModelArtifact of the real model file (the stand-ins mount it at /models)."""
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    spec = {"files": [{"name": model.name, "size": model.stat().st_size, "sha256": digest}],
            "source": {"http": {"baseURL": "https://models.invalid/smollm2"}},
            "storage": {"pvc": {"claimName": "models"}},
            "expectations": {"architecture": "llama", "blockCount": 30}}
    status = {"manifestDigest": ModelArtifactSpec.model_validate(spec).manifest_digest(),
              "gguf": {"architecture": "llama", "blockCount": 30},
              "conditions": [{"type": "Ready", "status": "True", "reason": "Verified",
                              "message": "all files verified"}]}
    return {"apiVersion": "meshnet.dev/v1alpha1", "kind": "ModelArtifact",
            "metadata": {"name": name, "namespace": NS}, "spec": spec, "status": status}


def mount_secrets(emulator: Emulator, spec: dict[str, Any], container: dict[str, Any],
                  root: Path) -> dict[str, str]:
    """Lays out the Secret volumes the container mounts under `root`, as the kubelet does
    (a volume's items renamed, or every key), and returns mount path -> folder here."""
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    secrets = {s["metadata"]["name"]: s for s in emulator.live("v1/secrets", NS)}
    folders = {}
    for mount in container.get("volumeMounts") or []:
        source = volumes[mount["name"]].get("secret")
        if source is None:
            continue
        data = {k: base64.b64decode(v)
                for k, v in (secrets[source["secretName"]].get("data") or {}).items()}
        folder = root / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        for item in source.get("items") or [{"key": k, "path": k} for k in data]:
            (folder / item["path"]).write_bytes(data[item["key"]])
        folders[mount["mountPath"]] = str(folder)
    return folders


def gateway_identity(emulator: Emulator, route: str, folder: Path) -> TlsFiles:
    """The route's gateway identity from the Secret the operator issued, as a client of
    the route's stages dialled at their pod IPs (the stage certificate's name checked)."""
    secret = next(s for s in emulator.live("v1/secrets", NS)
                  if s["metadata"]["name"] == f"{route}-identity")
    folder.mkdir(parents=True, exist_ok=True)
    for key, name in (("ca.crt", "ca.crt"), ("gateway.crt", "tls.crt"), ("gateway.key", "tls.key")):
        (folder / name).write_bytes(base64.b64decode(secret["data"][key]))
    return TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key",
                    stage_server_name(route, NS))


def route_secret(emulator: Emulator, route: str, folder: Path) -> RouteSecret:
    """The route's key from the Secret the operator issued, as its gateway reads it."""
    secret = next(s for s in emulator.live("v1/secrets", NS)
                  if s["metadata"]["name"] == f"{route}-identity")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "route.key").write_bytes(base64.b64decode(secret["data"]["route.key"]))
    return RouteSecret.load(folder / "route.key")


def remounted(args: list[str], folders: dict[str, str]) -> list[str]:
    """`args` with every path under a mount path moved to its folder here."""
    def here(arg: str) -> str:
        return next((folder + arg[len(path):] for path, folder in folders.items()
                     if arg.startswith(path + "/")), arg)
    return [here(arg) for arg in args]


@dataclass(frozen=True)
class PodCommand:
    """A stage pod's container args as this kubelet runs them (what WorkerProcess asks of
    a LaunchSpec): the pod's model mount is this machine's file, and the worker listens on
    the pod's IP, with one compute thread and no metrics port."""

    pod_args: tuple[str, ...]
    model: Path
    listen: str

    @property
    def layers(self) -> str:
        return self.pod_args[self.pod_args.index("--layers") + 1]

    def args(self) -> list[str]:
        local = {"--model": str(self.model), "--listen": self.listen, "--metrics-listen": ""}
        args = list(self.pod_args)
        for flag, value in local.items():
            args[args.index(flag) + 1] = value
        return [*args, "--threads", "1"]

    def environment(self, overrides: dict[str, str] | None = None) -> dict[str, str]:
        return {**WORKER_ENV_DEFAULTS, **os.environ, **(overrides or {})}  # as the image sets


@dataclass
class Kubelet:
    """Runs every stage pod as a worker on 127.0.0.N:port, reports it Running and Ready
    with that pod IP; stops the worker when the pod is deleted."""

    emulator: Emulator
    binary: Path
    model: Path
    log_dir: Path
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            live = {p["metadata"]["name"]: p for p in self.emulator.live("v1/pods", NS)
                    if labels.STAGE in (p["metadata"].get("labels") or {})}
            for name, pod in live.items():
                if name not in self.workers:
                    await self._start(name, pod)
            for name in [n for n in self.workers if n not in live]:
                await asyncio.to_thread(self.workers.pop(name).stop)
            await asyncio.sleep(0.1)

    async def _start(self, name: str, pod: dict[str, Any]) -> None:
        address = f"127.0.0.{len(self.addresses) + 2}"
        self.addresses[name] = address
        container = pod["spec"]["containers"][0]
        folders = mount_secrets(self.emulator, pod["spec"], container, self.log_dir / name)
        command = PodCommand(tuple(remounted(container["args"], folders)), self.model,
                             f"{address}:{container['ports'][0]['containerPort']}")
        worker = WorkerProcess(self.binary, command,  # type: ignore[arg-type]
                               self.log_dir / f"{name}.log")
        self.workers[name] = worker
        await asyncio.to_thread(worker.start)
        status = {"phase": "Running", "podIP": address,
                  "conditions": [{"type": "Ready", "status": "True"}],
                  "containerStatuses": [{"name": "worker", "restartCount": 0, "ready": True,
                                         "state": {"running": {"startedAt": now()}}}]}
        await self.emulator.patch(f"/api/v1/namespaces/{NS}/pods/{name}/status",
                                  json={"status": status})

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()


@dataclass
class JobController:
    """Runs each certification Job's container command here, with the model where the
    pod would mount it, then records its pod (termination message) and Job status."""

    emulator: Emulator
    binary: Path
    model: Path
    work: Path
    hold: asyncio.Event = field(default_factory=asyncio.Event)  # set: run Jobs
    ran: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hold.set()

    async def run(self) -> None:
        while True:
            await self.hold.wait()
            for job in self.emulator.live("batch/v1/jobs", NS):
                name = job["metadata"]["name"]
                if name not in self.ran:
                    self.ran.append(name)
                    await self._run(name, job)
            await asyncio.sleep(0.1)

    async def _run(self, name: str, job: dict[str, Any]) -> None:
        container = job["spec"]["template"]["spec"]["containers"][0]
        message = self.work / f"{name}.termination-log"
        folders = mount_secrets(self.emulator, job["spec"]["template"]["spec"], container,
                                self.work / name)
        args = [str(message) if a == TERMINATION_LOG else
                str(self.model) if a.startswith(f"{MODEL_DIR}/") else a
                for a in remounted(container["args"], folders)]
        args += ["--reference-threads", "1"]  # one CPU per pod, as the kubelet gives workers
        env = {**os.environ, "MESHNET_BIN_DIR": str(self.binary.parent),
               "MESHNET_CACHE": str(self.work / "cache")}
        with (self.work / f"{name}.log").open("w") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "meshnet.cli", *args, env=env, stdout=log, stderr=log)
            code = await process.wait()
        text = message.read_text() if message.is_file() else \
            (self.work / f"{name}.log").read_text()[-4096:]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{name}-run", "namespace": NS,  # as the Job controller:
                            "labels": {**job["spec"]["template"]["metadata"]["labels"],
                                       JOB_NAME_LABEL: name}},
               "spec": job["spec"]["template"]["spec"]}
        await self.emulator.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
        terminated = {"exitCode": code, "message": text, "finishedAt": now()}
        await self.emulator.patch(f"/api/v1/namespaces/{NS}/pods/{name}-run/status", json={
            "status": {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
                {"name": "certify", "state": {"terminated": terminated}}]}})
        outcome = {"succeeded": 1} if code == 0 else {"failed": 1, "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
        await self.emulator.patch(f"/apis/batch/v1/namespaces/{NS}/jobs/{name}/status",
                                  json={"status": outcome})


@contextlib.asynccontextmanager
async def running(*loops: Kubelet | JobController) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(loop.run()) for loop in loops]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for loop in loops:
            if isinstance(loop, Kubelet):
                await asyncio.to_thread(loop.stop)
