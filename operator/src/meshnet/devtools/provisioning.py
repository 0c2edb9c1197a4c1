"""The Job controller and kubelet for ModelArtifact provisioning Jobs, played here against
the emulator (which stores Jobs but runs nothing): the Job's container command really runs
on this machine, with each volume mount mapped to a local folder, and what it reported
becomes the pod's termination message and the Job's status, as a cluster would show them."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock

from meshnet.api import labels
from meshnet.devtools.cluster import Emulator
from meshnet.timestamps import now_rfc3339

PROVISIONING_RESOURCES: dict[str, dict[str, Any]] = {
    "batch/v1/jobs": {"kind": "Job", "namespaced": True, "subresources": ["status"]},
    "v1/configmaps": {"kind": "ConfigMap", "namespaced": True},
    "v1/nodes": {"kind": "Node", "namespaced": False},
}
VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]


def declare_provisioning(emulator: Emulator) -> None:
    """Serve what artifact provisioning touches besides the resources every test has."""
    for resource, info in PROVISIONING_RESOURCES.items():
        emulator.resources[resource] = kmock.ResourceInfo(verbs=VERBS, **info)


async def add_node(emulator: Emulator, name: str, node_labels: Mapping[str, str]) -> None:
    response = await emulator.post("/api/v1/nodes", json={
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **node_labels}}})
    assert response.status == 200, await response.text()


def _now() -> str:
    return now_rfc3339()


@dataclass(frozen=True)
class Storage:
    """Where this machine keeps what a pod's volumes would mount."""

    claims: Mapping[str, Path]  # PVC name -> folder
    host: Callable[[str | None, str], Path]  # (node, hostPath) -> folder


@dataclass(frozen=True)
class Attempt:
    """One run of a Job's container here."""

    job: str
    node: str | None
    exit_code: int
    message: str  # the termination message
    output: str  # what it printed

    @property
    def summary(self) -> dict[str, Any] | None:
        try:
            parsed = json.loads(self.message)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None


def _node(pod: Mapping[str, Any]) -> str | None:
    affinity = ((pod.get("affinity") or {}).get("nodeAffinity") or {})
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms") or []
    for term in terms:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return pod.get("nodeName")


class JobRunner:
    """Runs provisioning Jobs of one namespace: each call is one attempt of one Job."""

    def __init__(self, emulator: Emulator, namespace: str, storage: Storage, work: Path) -> None:
        self.emulator, self.namespace, self.storage, self.work = emulator, namespace, storage, work
        self.restarts: dict[str, int] = {}

    def job(self, name: str) -> dict[str, Any]:
        found = [j for j in self.emulator.live("batch/v1/jobs", self.namespace)
                 if j["metadata"]["name"] == name]
        assert found, f"no Job {name}"
        return found[0]

    def _mounts(self, job: str, pod: Mapping[str, Any], node: str | None) -> dict[str, Path]:
        """mountPath -> local folder, for the pod's first container."""
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        maps = {m["metadata"]["name"]: m
                for m in self.emulator.live("v1/configmaps", self.namespace)}
        mounts = {}
        for mount in pod["containers"][0].get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            local = self.work / job / mount["name"]
            if "configMap" in volume:
                local.mkdir(parents=True, exist_ok=True)
                for key, text in (maps[volume["configMap"]["name"]].get("data") or {}).items():
                    (local / key).write_text(text)
            elif "persistentVolumeClaim" in volume:
                local = self.storage.claims[volume["persistentVolumeClaim"]["claimName"]]
            elif "hostPath" in volume:
                local = self.storage.host(node, volume["hostPath"]["path"])
                if volume["hostPath"].get("type") == "DirectoryOrCreate":
                    local.mkdir(parents=True, exist_ok=True)
            else:
                local.mkdir(parents=True, exist_ok=True)  # emptyDir
            mounts[mount["mountPath"]] = local
        return mounts

    async def run(self, name: str, *, final: bool = True) -> Attempt:
        """Run the Job's container once; record it as the kubelet and the Job controller
        would: success completes the Job; a failure restarts the container (OnFailure)
        unless `final`, which fails the Job (its back-off limit reached)."""
        job = self.job(name)
        pod = job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        node = _node(pod)
        mounts = self._mounts(name, pod, node)
        log = self.work / name / "termination-log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")

        def local(arg: str) -> str:
            if arg == container.get("terminationMessagePath", "/dev/termination-log"):
                return str(log)
            for path in sorted(mounts, key=len, reverse=True):
                if arg == path or arg.startswith(path + "/"):
                    return str(mounts[path]) + arg[len(path):]
            return arg

        command = [*container.get("command", []), *container.get("args", [])]
        assert command[0] == "meshnet", command
        env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env") or []}}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "meshnet.cli", *map(local, command[1:]), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await process.communicate()
        attempt = Attempt(name, node, process.returncode or 0, log.read_text(),
                          output.decode(errors="replace"))
        await self._report(job, attempt, final)
        return attempt

    async def _report(self, job: dict[str, Any], attempt: Attempt, final: bool) -> None:
        name, template = attempt.job, job["spec"]["template"]
        pod_name = f"{name}-0"
        base = f"/api/v1/namespaces/{self.namespace}"
        if name not in self.restarts:
            response = await self.emulator.post(f"{base}/pods", json={
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": self.namespace,
                             "labels": {**template["metadata"]["labels"],
                                        labels.JOB_NAME: name, "job-name": name},
                             "annotations": template["metadata"].get("annotations") or {},
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                  "name": name,
                                                  "uid": job["metadata"].get("uid", "")}]},
                "spec": {**template["spec"], **({"nodeName": attempt.node} if attempt.node
                                                 else {})}})
            assert response.status == 200, await response.text()
            self.restarts[name] = 0
        ended = {"exitCode": attempt.exit_code, "message": attempt.message,
                 "finishedAt": _now(), "reason": "Completed" if attempt.exit_code == 0
                 else "Error"}
        container = job["spec"]["template"]["spec"]["containers"][0]["name"]
        if attempt.exit_code == 0 or final:
            status = {"phase": "Succeeded" if attempt.exit_code == 0 else "Failed",
                      "containerStatuses": [{"name": container, "state": {"terminated": ended},
                                             "restartCount": self.restarts[name]}]}
            outcome: dict[str, Any] = (
                {"active": 0, "succeeded": 1, "conditions": [
                    {"type": "Complete", "status": "True", "lastTransitionTime": _now()}]}
                if attempt.exit_code == 0 else
                {"active": 0, "failed": 1, "conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit",
                     "lastTransitionTime": _now()}]})
        else:  # restartPolicy OnFailure: the kubelet restarts the container in place
            self.restarts[name] += 1
            waiting = {"reason": "CrashLoopBackOff", "message": "back-off restarting"}
            status = {"phase": "Running",
                      "containerStatuses": [{"name": container, "state": {"waiting": waiting},
                                             "lastState": {"terminated": ended},
                                             "restartCount": self.restarts[name]}]}
            outcome = {"active": 1}
        await self.emulator.patch(f"{base}/pods/{pod_name}/status", json={"status": status})
        await self.emulator.patch(
            f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{name}/status",
            json={"status": outcome})
