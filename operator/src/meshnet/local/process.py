"""Start and stop meshnet-shard-worker processes on this machine (the local backend,
`meshnet worker run`, the certification reference, tests and benchmarks): the command
line, readiness from the worker's own log line, and a restart on the same port."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from meshnet.errors import MeshnetError
from meshnet.local.vulkan import software_device_env
from meshnet.reconcile.route.worker_command import WorkerCommand
from meshnet.route.route_key import RouteSecret

# Defaults for a worker's environment, each overridden by the caller's. An OpenMP thread
# that finished a step spins GOMP_SPINCOUNT times before it sleeps (libgomp's default: for
# milliseconds). On stages sharing a machine's cores, a spin that outlasts the hand-off to
# the next stage takes a core from that stage's first microseconds of compute, while one
# too short puts threads to sleep inside a step; this count spins for less than the
# hand-off (BENCHMARKS.md, route driver measurements).
WORKER_ENV_DEFAULTS = {"GOMP_SPINCOUNT": "3000"}

_LISTENING = re.compile(r"listening on port (\d+)")
_METRICS = re.compile(r"metrics on port (\d+)")
# Logged as the worker's gRPC health turns SERVING, the readiness a pod's probe asks for: at
# once, except on a ring's first stage, once it subscribed at the last stage (or, failing
# that, after --ring-ready-ms).
SERVING = "meshnet-shard-worker: serving"


class WorkerStartError(MeshnetError):
    """The worker process exited or did not come up in time."""


@dataclass(frozen=True)
class LaunchSpec(WorkerCommand):
    """How one worker process is started here: its flags, whether it stops with the
    process that starts it, and the CPUs its compute threads are bound to."""

    exit_with_parent: bool = False  # the worker stops when the process starting it exits
    # CPUs for the engine's compute threads, in order (the worker's other threads stay on
    # the first); () leaves placement to the kernel. See cpu_binding_env.
    cpus: tuple[int, ...] = ()

    @classmethod
    def of(cls, command: WorkerCommand, **changes: Any) -> LaunchSpec:
        """`command` started here, with `changes` to its fields or this class's."""
        return cls(**{**{f.name: getattr(command, f.name) for f in fields(command)}, **changes})

    def environment(self, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
        """The worker's whole environment: our defaults, then the caller's, then what this
        spec needs (set before it starts), then `overrides`. ValueError for unusable cpus.
        A stage that offloads layers on a host whose only Vulkan device is a software one
        is given that device (local/vulkan.py; other lanes' builds ignore it)."""
        device = software_device_env({**os.environ, **(overrides or {})}) \
            if self.gpu_layers else {}
        return {**WORKER_ENV_DEFAULTS, **os.environ, **device, **cpu_binding_env(self.cpus),
                **(overrides or {})}

    def args(self, parent_pid: int | None = None) -> list[str]:
        """The command line; --exit-with-parent names this process when the spec says so."""
        if parent_pid is None and self.exit_with_parent:
            parent_pid = os.getpid()
        return super().args(parent_pid)


def cpu_binding_env(cpus: Sequence[int]) -> dict[str, str]:
    """Binds a process's OpenMP compute threads to `cpus`, thread i to the i-th (wrapping),
    through libgomp's GOMP_CPU_AFFINITY, read when the process starts. The process's first
    thread is bound to the first CPU, and every thread it starts later (gRPC's, the
    engine's) inherits that. Two stages sharing a host both bound to 0,1 hand a token
    over on one CPU that is always awake, rather than waking an idle one (measured in
    bench/route_bench.py --pin)."""
    if not cpus:
        return {}
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - allowed)
    if missing:
        raise ValueError(f"CPU(s) {', '.join(map(str, missing))} not available to this process "
                         f"(allowed: {', '.join(map(str, sorted(allowed)))})")
    return {"GOMP_CPU_AFFINITY": " ".join(str(cpu) for cpu in cpus)}


def stop_process(process: subprocess.Popen[Any], grace: float) -> int:
    """SIGTERM, then SIGKILL after `grace` seconds (or at once on a second Ctrl-C while it
    waits); its exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    return process.returncode


def free_port() -> int:
    """A port free on 127.0.0.1 right now (for workers that must keep their address)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class WorkerProcess:
    """A running worker; `endpoint` is "127.0.0.1:PORT" once `start` returned."""

    def __init__(self, binary: Path, spec: LaunchSpec, log_path: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.binary = binary
        self.spec = spec
        self.log_path = log_path
        self.env = env
        self.port = 0
        self.metrics_port = 0
        self.lines: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._serving = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc else -1

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def serving(self) -> bool:
        """Its gRPC health turned SERVING (the worker's SERVING line) since it started."""
        return self._serving.is_set()

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def start(self, timeout: float = 120.0) -> WorkerProcess:
        self._ready.clear()
        self._serving.clear()
        self.lines = []
        self._proc = subprocess.Popen(
            [str(self.binary), *self.spec.args()],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=self.spec.environment(self.env),
        )
        threading.Thread(target=self._pump, args=(self._proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                tail = "\n".join(self.lines[-20:])
                raise WorkerStartError(f"worker {self.spec.layers} did not start:\n{tail}")
        # The port is fixed from now on, so a restart keeps the endpoint.
        self.spec = replace(self.spec, listen=f"127.0.0.1:{self.port}")
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        sink = self.log_path.open("a") if self.log_path else None
        for line in proc.stderr:
            self.lines.append(line.rstrip())
            if sink:
                sink.write(line)
                sink.flush()
            if match := _METRICS.search(line):
                self.metrics_port = int(match.group(1))
            if match := _LISTENING.search(line):
                self.port = int(match.group(1))
                self._ready.set()
            if SERVING in line:
                self._serving.set()
        if sink:
            sink.close()

    def wait_for_line(self, text: str, timeout: float) -> None:
        """Until the worker's log has a line with `text`; WorkerStartError after `timeout`."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if not self.running() or time.monotonic() > deadline:
                tail = "\n".join(self.lines[-20:])
                raise WorkerStartError(f"worker {self.spec.layers} never logged {text!r}:\n{tail}")
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; the exit code."""
        if self._proc is None or self._proc.poll() is not None:
            return self._proc.returncode if self._proc else None
        self._proc.send_signal(signal.SIGTERM)
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def kill(self) -> int | None:
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.kill()
        return self._proc.wait()

    def restart(self, timeout: float = 120.0) -> WorkerProcess:
        self.kill()
        return self.start(timeout)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_route(binary: Path, specs: Sequence[LaunchSpec], log_dir: Path | None = None,
                timeout: float = 120.0, chain: bool = False,
                ring: bool = False, env: dict[str, str] | None = None) -> list[WorkerProcess]:
    """Starts one worker per spec (one at a time: model loading is CPU heavy); with
    `chain`, each stage's --next-stage is its successor, and with `ring` (a chain too) the
    first stage's --ring-last is the last stage. Every worker binds a port the kernel
    picks and keeps it; a chain starts from its last stage so each stage names stages that
    already listen (a port reserved ahead could be taken meanwhile). A chain's workers get
    a route key (the specs' own, else a new one in `log_dir` or a private temporary
    folder), which the ring and the local relay need: drive it with route_key_of(workers)."""
    chain = chain or ring
    specs = [replace(spec, pipeline_depth=spec.pipeline_depth or len(specs)) for spec in specs]
    if chain and not any(spec.route_key_file for spec in specs):
        key_file = new_route_key_file(log_dir)
        specs = [replace(spec, route_key_file=key_file) for spec in specs]
    workers: dict[int, WorkerProcess] = {}
    order = range(len(specs) - 1, -1, -1) if chain else range(len(specs))
    try:
        for index in order:
            spec = specs[index]
            if chain and index + 1 < len(specs):
                spec = replace(spec, next_stage=workers[index + 1].endpoint)
            if ring and index == 0 and len(specs) > 1:
                spec = replace(spec, ring_last=workers[len(specs) - 1].endpoint)
            log = log_dir / f"worker-{index}.log" if log_dir else None
            workers[index] = WorkerProcess(binary, spec, log, env).start(timeout)
        if ring and len(specs) > 1:
            # subscribed at the last stage: a driver may ask for the ring at once
            workers[0].wait_for_line(SERVING, timeout)
    except BaseException:
        for worker in workers.values():
            worker.kill()
        raise
    return [workers[index] for index in range(len(specs))]


def new_route_key_file(folder: Path | None = None) -> Path:
    """A new route key written in `folder` (else a new private temporary folder), mode 0600."""
    folder = folder or Path(tempfile.mkdtemp(prefix="meshnet-route-key-"))
    return RouteSecret.generate().write(folder / f"route-{os.getpid()}-{time.monotonic_ns()}.key")


def route_key_of(workers: Sequence[WorkerProcess]) -> RouteSecret | None:
    """The route key the workers were started with (None: none)."""
    files = {w.spec.route_key_file for w in workers if w.spec.route_key_file}
    if len(files) > 1:
        raise ValueError("the workers were started with different route keys")
    return RouteSecret.load(Path(files.pop())) if files else None


def worker_binary(dev: bool = False, lane: str = "cpu", name: str = "meshnet-shard-worker") -> Path:
    """meshnet-shard-worker of `lane` (or the build's other binary `name`, e.g. the
    benchmarks' meshnet-shard-worker-bench): MESHNET_BIN_DIR, else the cached build, else
    (or with `dev`) the incremental dev build of `meshnet worker build --dev`."""
    from meshnet.buildsteps.cmake import BuildError
    from meshnet.native.build import find_binary
    from meshnet.paths import workspace
    from meshnet.pin.workspace import Workspace

    ws = Workspace(workspace())
    dev_binary = ws.root / f"worker-dev-{lane}" / "build" / "bin" / name
    if dev and dev_binary.is_file():
        return dev_binary
    try:
        return find_binary(name, ws, lane)
    except BuildError:
        if dev_binary.is_file():
            return dev_binary
        raise


def model_files(model: Path) -> list[Path]:
    """The GGUF file, or every file of its split set (NAME-0000i-of-0000n.gguf)."""
    match = re.fullmatch(r"(.*)-(\d{5})-of-(\d{5})\.gguf", model.name)
    if not match:
        return [model]
    prefix, _, count = match.groups()
    return [model.with_name(f"{prefix}-{i:05d}-of-{count}.gguf") for i in range(1, int(count) + 1)]


def local_manifest_digest(model: Path) -> str:
    """manifestDigest of a model on local disk (hashes every file of the set)."""
    from meshnet.digests import manifest_digest
    from meshnet.pin.manifest import sha256_file

    return manifest_digest((p.name, p.stat().st_size, sha256_file(p)) for p in model_files(model))
