"""Apply the operator's plan to local worker processes.

The planner is the one the Kubernetes backend uses. Two differences, both because a
machine is not a cluster: a pod is a process on a loopback port, and an epoch change is
make-before-break — old-epoch workers are hidden from the planner (so it starts the new
epoch at once) but keep serving until the new epoch is Ready, then they are stopped.
So a chained stage relays to the loopback endpoint of its own epoch's and its own
replica's next stage (`meshnet.local.links`), never to another epoch's or replica's.
Each replica (spec.replicas) is a pipeline of its own workers; scaling adds whole
replicas, or drains them (meshnet.local.drain), and leaves the others running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshnet.api import labels
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.artifacts.markers import Layout
from meshnet.artifacts.retain import prune_manifests
from meshnet.errors import MeshnetError
from meshnet.local.drain import drain_ended
from meshnet.local.links import NotListening, loopback_links, start_order
from meshnet.local.manifests import RouteFile, RouteFileError
from meshnet.local.process import WorkerProcess, WorkerStartError
from meshnet.local.provision import LocalArtifact, provision
from meshnet.local.registry import publish, withdraw
from meshnet.local.restarts import DEFAULT_BUDGET, RestartPolicy
from meshnet.local.stages import LocalStage, launch_spec, worker_name
from meshnet.metrics.controller import OperatorMetrics
from meshnet.reconcile.naming import service_name
from meshnet.reconcile.plan import Create, Delete, Patch, Plan
from meshnet.reconcile.route import (
    Observed,
    ObservedPod,
    WorkerConfig,
    WorkerSpec,
    observe_route,
    plan,
    spec_problems,
)
from meshnet.route.route_key import RouteSecret
from meshnet.timestamps import utc_now

Say = Callable[[str], None]


class StageGaveUp(MeshnetError):
    """A stage crashed more often than the restart budget allows."""


class LocalBackend:
    def __init__(
        self,
        binary: Path,
        log_dir: Path,
        pin_digest: str,
        say: Say,
        threads: int = 0,
        metrics: OperatorMetrics | None = None,
        gateway_url: str | None = None,
        restart_budget: int = DEFAULT_BUDGET,
        key_dir: Path | None = None,
    ) -> None:
        self.binary = binary
        # The route's key (meshnet.route.route_key), new for each `meshnet up`: its workers,
        # its gateway and whoever drives the route from this machine (the registry names
        # the file) hold it; nobody else on the host can run, read or end its sessions.
        self.key_dir = key_dir or log_dir.parent / "route-keys"
        self._route_key_file: Path | None = None
        self.gateway_url = gateway_url  # the OpenAI base URL `meshnet up` serves the route on
        # The operator's own metrics, so one dashboard serves a cluster and this machine.
        self.metrics = metrics or OperatorMetrics()
        self.log_dir = log_dir
        self.say = say
        self.threads = threads
        self.config = WorkerConfig(
            images={"cpu": "local", "cuda": "local", "rocm": "local", "vulkan": "local"},
            pin_digest=pin_digest,
            side_by_side=False,  # make-before-break is this backend's own (see above)
        )
        self.stages: dict[str, LocalStage] = {}
        self.status: dict[str, Any] = {}
        self.crashes = RestartPolicy(restart_budget)
        # A crashed worker's pod as the kubelet would show it while it backs off (or
        # after we gave up), so status and metrics say CrashLoopBackOff meanwhile.
        self.crashed: dict[str, ObservedPod] = {}  # pod name -> its placeholder
        self.gave_up: str | None = None
        # A crashed worker comes back on its port, so drivers holding the route's
        # endpoints (`meshnet generate --route`) recover as they do from a pod restart.
        self.ports: dict[str, int] = {}  # pod name -> its gRPC port
        self.service_hashes: dict[int, str] = {}  # replica -> its Service's template
        self.route_file: RouteFile | None = None
        self.artifact: LocalArtifact | None = None
        # Each manifest some worker may still start from (by digest): an epoch's workers
        # load their own manifest's files, kept until no epoch uses it.
        self.manifests: dict[str, LocalArtifact] = {}
        self.generation = 0

    # ---- inputs ----------------------------------------------------------------
    def load(self, route_file: RouteFile) -> None:
        """Take a (re)read route file: re-provision a changed artifact, bump the generation.

        A ShardRoute the planner cannot serve is refused (RouteFileError) before anything
        changes: the route loaded before runs on, as a Deployment keeps its pods when an
        update cannot roll out."""
        route = observe_route(route_file.route)
        previous, artifact = self.route_file, self.artifact
        if previous is None or previous.artifact.get("spec") != route_file.artifact.get("spec"):
            self.say(f"provisioning ModelArtifact {route_file.artifact['metadata']['name']} ...")
            artifact = provision(route_file.artifact)
            self.say(
                f"artifact ready: {artifact.storage / artifact.observed.model_file} "
                f"(manifestDigest {artifact.observed.manifest_digest})"
            )
        assert artifact is not None
        problems = spec_problems(route, artifact.observed, self.config)
        if problems:
            raise RouteFileError(f"{route_file.path}: invalid spec:"
                                 f" {'; '.join(map(str, problems))}")
        if artifact is not self.artifact:
            meta = route_file.artifact["metadata"]
            self.metrics.status.artifact(
                (meta.get("namespace") or "default", meta["name"]), artifact.status
            )
            self.artifact = artifact
            self.manifests[artifact.observed.manifest_digest or ""] = artifact
        if previous is None or previous.route.get("spec") != route_file.route.get("spec"):
            self.generation += 1
        self.route_file = route_file

    def observe(self) -> Observed:
        assert self.route_file is not None and self.artifact is not None
        doc = self.route_file.route
        body = {
            **doc,
            "metadata": {
                **doc["metadata"],
                "uid": f"local-{doc['metadata']['name']}",
                "generation": self.generation,
            },
            "status": self.status,
        }
        pods = tuple(s.observed() for s in self.stages.values() if not s.retiring)
        now = time.monotonic()  # once its backoff is over the planner starts it anew
        pods += tuple(p for name, p in self.crashed.items()
                      if name not in self.stages
                      and not self.crashes.may_start(worker_name(p.stage, p.replica), now))
        return Observed(observe_route(body), pods, dict(self.service_hashes),
                        self.artifact.observed)

    # ---- one reconcile -----------------------------------------------------------
    def reconcile(self) -> Plan:
        started = time.monotonic()
        self.metrics.reconciles.labels("ShardRoute").inc()
        observed = self.observe()
        result = plan(observed, self.config, utc_now())
        for event in result.events:
            self.say(f"{event.reason}: {event.message}")
        if result.status is not None:
            self.status = result.status
        new_pods = {(a.worker.replica, a.worker.stage): (a.obj, a.worker)
                    for a in result.actions if isinstance(a, Create) and a.worker is not None}
        for action in result.actions:
            if not (isinstance(action, Create) and action.worker is not None):
                self._apply(action)
        for replica in sorted({r for r, _ in new_pods}):  # each chain from its end
            workers = [w for (r, _), (_, w) in new_pods.items() if r == replica]
            for worker in start_order(workers):
                self._start(new_pods[replica, worker.stage][0], worker)
        self._finish_rollout()
        self._finish_drains()
        key = (observed.route.namespace, observed.route.name)
        self.metrics.duration.labels("ShardRoute").observe(time.monotonic() - started)
        self.metrics.epoch_advances.inc(int(result.epoch_advanced))
        self.metrics.route_conditions(key, result.conditions)
        self.metrics.status.route(key, self.status)
        if self.gave_up:
            raise StageGaveUp(self.gave_up)
        return result

    def _apply(self, action: Create | Patch | Delete) -> None:
        if isinstance(action, Delete) and action.kind == "Pod":
            self._stop_or_retire(action.name)
        elif action_kind(action) == "Service":  # no Services here; remember what was applied
            if isinstance(action, Delete):
                self.service_hashes = {
                    r: h for r, h in self.service_hashes.items()
                    if service_name(self.route_name, r) != action.name}
            else:
                replica, template = _service_hash(action)
                self.service_hashes[replica] = template

    def _start(self, pod: dict[str, Any], worker: WorkerSpec) -> None:
        assert self.artifact is not None
        stage = worker_name(worker.stage, worker.replica)
        if not self.crashes.may_start(stage, time.monotonic()):
            return  # backing off; the next reconcile asks again
        name = pod["metadata"]["name"]
        if self._undrained(name, pod):
            return
        try:
            links = loopback_links(worker, self._listening(worker.epoch, worker.replica))
        except NotListening as exc:  # its next stage did not start: the next reconcile asks
            self.say(f"stage {stage}: not started, {exc}")
            return
        self.crashed.pop(name, None)
        model = self.manifests[worker.identities.manifest_digest].model_path
        spec = launch_spec(worker, model, self.threads, links, self.route_key_file())
        if name in self.ports:
            spec = replace(spec, listen=f"127.0.0.1:{self.ports[name]}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        process = WorkerProcess(self.binary, spec, self.log_dir / f"{name}.log")
        entry = LocalStage(pod, worker, process, restarts=self.crashes.total[stage])
        self.stages[entry.name] = entry
        try:
            process.start()
        except WorkerStartError as exc:
            kept = self.ports.pop(name, None)  # taken meanwhile? the next start picks anew
            self.say(f"stage {stage}: worker did not start"
                     f"{f' on port {kept}' if kept else ''}: {exc}")
            return
        self.ports[name] = process.port
        self.say(
            f"stage {stage}: layers {worker.layers} epoch {worker.epoch} "
            f"on {process.endpoint} (pid {process.pid})"
        )

    def _listening(self, epoch: int, replica: int) -> dict[str, str]:
        """Stage name -> loopback endpoint of each running worker of `epoch` in `replica`
        (never another epoch's: a new epoch's chain starts beside the old one, see the
        module; never another replica's: each replica is a pipeline of its own)."""
        return {s.stage: s.process.endpoint for s in self.stages.values()
                if s.epoch == epoch and s.replica == replica and not s.retiring and s.alive()}

    def _stop_or_retire(self, name: str) -> None:
        entry = self.stages.get(name)
        if entry is None:
            self.crashed.pop(name, None)  # e.g. a crashed pod of a replaced epoch
            return
        epoch = int(self.status.get("epoch") or 0)
        if entry.alive() and entry.epoch < epoch:
            entry.retiring = True  # keeps serving until epoch `epoch` is Ready
            return
        if entry.alive() and entry.replica >= self.replicas_wanted() and self.drain_seconds():
            entry.retiring, entry.draining_since = True, time.monotonic()  # scaled away
            return
        if entry.alive():
            self.ports.pop(name, None)  # gone for good, not crashed
        else:
            self._note_crash(entry)
        entry.process.stop()
        del self.stages[name]

    def _note_crash(self, entry: LocalStage) -> None:
        stage, code, log = entry.who, entry.process.exit_code(), entry.process.log_path
        delay = self.crashes.crashed(stage, time.monotonic())
        count = self.crashes.total[stage]
        if self.crashes.exhausted(stage):
            crashes = self.crashes.crashes_in_window(stage)
            detail = (f"worker exited with code {code}, crash {crashes} "
                      f"within {self.crashes.window / 60:.0f} min (restart budget "
                      f"{self.crashes.budget}): not restarted again; its log: {log}")
            self.gave_up = f"stage {stage}: {detail}"
        else:
            detail = (f"worker exited with code {code}; restart #{count} in {delay:.0f}s; "
                      f"its log: {log}")
        self.say(f"stage {stage}: {detail}")
        self.crashed[entry.name] = replace(
            entry.observed(), phase="Pending", restarts=count,
            failing_reason="CrashLoopBackOff", failing_message=detail,
        )

    def _finish_rollout(self) -> None:
        """Once the current epoch is Ready (or scaled to zero): stop retired workers and
        publish the route."""
        if not self.settled():
            return
        retired = [s for s in self.stages.values() if s.retiring and s.draining_since is None]
        for entry in retired:
            entry.process.stop()
            del self.stages[entry.name]
            self.ports.pop(entry.name, None)
        if retired:
            self.say(
                f"epoch {self.status['epoch']} is ready; stopped {len(retired)} workers "
                f"of epoch {retired[0].epoch}"
            )
            self._forget_manifests()
        publish(self.route_name, self.route_entry())

    def _forget_manifests(self) -> None:
        """Drop the files of manifests no worker and no epoch uses any more (the links that
        kept replaced bytes for an old epoch's workers, see meshnet.artifacts.retain)."""
        assert self.artifact is not None
        used = {s.worker.identities.manifest_digest for s in self.stages.values()}
        used.add(self.artifact.observed.manifest_digest or "")
        for digest in [d for d in self.manifests if d not in used]:
            gone = self.manifests.pop(digest)
            if gone.directory != gone.storage:
                prune_manifests(Layout(gone.storage), [digest])

    def _finish_drains(self) -> None:
        """Stops each scaled-away replica whose drain has ended (meshnet.local.drain)."""
        draining: dict[int, list[LocalStage]] = {}
        for entry in self.stages.values():
            if entry.draining_since is not None:
                draining.setdefault(entry.replica, []).append(entry)
        for replica, entries in sorted(draining.items()):
            since = min(e.draining_since or 0.0 for e in entries)
            why = ("a worker of it exited" if not all(e.alive() for e in entries) else
                   drain_ended(time.monotonic() - since, self.drain_seconds(),
                               [e.process.endpoint for e in entries]))
            if why is None:
                continue
            for entry in entries:
                entry.process.stop()
                del self.stages[entry.name]
                self.ports.pop(entry.name, None)
            self.say(f"replica {replica} drained ({why}): stopped its {len(entries)} workers")

    def _undrained(self, name: str, pod: dict[str, Any]) -> bool:
        """A pod to start whose worker still drains (scaled down, then up again): the same
        worker serves on; another template's stops first. Whether it serves on."""
        entry = self.stages.get(name)
        if entry is None or entry.draining_since is None:
            return False
        template = pod["metadata"]["labels"].get(labels.TEMPLATE)
        if entry.alive() and entry.labels.get(labels.TEMPLATE) == template:
            entry.retiring, entry.draining_since = False, None
            return True
        entry.process.stop()
        del self.stages[name]
        self.ports.pop(name, None)
        return False

    # ---- what it serves ----------------------------------------------------------
    @property
    def route_name(self) -> str:
        assert self.route_file is not None
        return self.route_file.route_name

    def route_key_file(self) -> Path:
        """The route's key file (mode 0600), written at the first ask."""
        if self._route_key_file is None:
            self._route_key_file = RouteSecret.generate().write(
                self.key_dir / f"{self.route_name}.key")
        return self._route_key_file

    def ready(self) -> bool:
        """Ready as planned, and every replica whole, no worker of the route stopped since:
        the plan that replaces pods at the same epoch (a topology edit) saw them ready
        before."""
        conditions = {c["type"]: c["status"] for c in self.status.get("conditions") or []}
        return (conditions.get("Ready") == "True"
                and len(self.whole_replicas()) == self.replicas_wanted())

    def settled(self) -> bool:
        """Ready, or scaled to zero: what there is to serve is running."""
        return self.ready() or (self.route_file is not None and self.replicas_wanted() == 0)

    def replicas_wanted(self) -> int:
        assert self.route_file is not None
        return int((self.route_file.route.get("spec") or {}).get("replicas", 1))

    def drain_seconds(self) -> int:
        """spec.rollout.drainSeconds: how long a scaled-away replica may drain."""
        assert self.route_file is not None
        spec = ShardRouteSpec.model_validate(self.route_file.route.get("spec") or {})
        return spec.rollout.drain_seconds

    def current_stages(self, replica: int = 0) -> list[LocalStage]:
        """This epoch's workers of `replica` in pipeline order."""
        epoch = int(self.status.get("epoch") or 0)
        order = [
            s["name"] for s in (self.route_file.route["spec"]["stages"] if self.route_file else [])
        ]
        live = {s.stage: s for s in self.stages.values()
                if s.epoch == epoch and s.replica == replica and not s.retiring}
        return [live[name] for name in order if name in live]

    def whole_replicas(self) -> list[int]:
        """The replicas below spec.replicas with a worker of this epoch for every stage."""
        stages = self.route_file.route["spec"]["stages"] if self.route_file else []
        return [r for r in range(self.replicas_wanted())
                if len(self.current_stages(r)) == len(stages)]

    def route_entry(self) -> dict[str, Any]:
        replicas = self._replica_entries()
        return {
            "name": self.route_name,
            "epoch": self.status.get("epoch"),
            "routeDigest": self.status.get("routeDigest"),
            # What `meshnet certify` and `meshnet tracker report` need: identities, the
            # model for the unsplit reference, and each worker's start and restarts.
            "manifestDigest": self.status.get("manifestDigest"),
            "recipeDigest": self.status.get("recipeDigest"),
            "model": str(self.artifact.model_path) if self.artifact else "",
            "threads": self.threads,
            "file": str(self.route_file.path) if self.route_file else "",
            "gateway": self.gateway_url,
            "routeKeyFile": str(self.route_key_file()),
            # the first whole replica's, for what drives one pipeline (`meshnet generate`)
            "stages": replicas[0]["stages"] if replicas else [],
            "replicas": replicas,  # the gateway spreads sessions over all of them
        }

    def _replica_entries(self) -> list[dict[str, Any]]:
        return [{"replica": replica, "stages": [
            {
                "name": s.stage,
                "layers": str(s.worker.layers),
                "endpoint": s.process.endpoint,
                "metrics": f"127.0.0.1:{s.process.metrics_port}",
                "pid": s.process.pid,
                "restarts": s.restarts,
                "startedAt": s.started_at,
            }
            for s in self.current_stages(replica)
        ]} for replica in self.whole_replicas()]

    def shutdown(self) -> int:
        """Stop every worker (SIGTERM, then SIGKILL); the number stopped."""
        if self.route_file is not None:
            withdraw(self.route_name)
        count = 0
        for entry in list(self.stages.values()):
            entry.process.stop()
            count += 1
        self.stages.clear()
        return count


def action_kind(action: Create | Patch | Delete) -> str:
    return str(action.obj["kind"]) if isinstance(action, Create) else action.kind


def _service_hash(action: Create | Patch) -> tuple[int, str]:
    """The replica a Service is for, and its template hash."""
    meta = action.obj["metadata"] if isinstance(action, Create) else action.body["metadata"]
    found = meta.get("labels", {})
    return int(found.get(labels.REPLICA, "0")), str(found.get(labels.TEMPLATE))
