"""`meshnet worker`: build and run the C++ shard worker."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click

from meshnet import digests
from meshnet.api.shardroute import LayerRange, Recipe
from meshnet.cli.drift import report_drift
from meshnet.cli.pin import lane_option, portable_option, say
from meshnet.cli.worker_doc import RENDERED_SECTION, unexplained, worker_doc
from meshnet.local.process import (
    LaunchSpec,
    cpu_binding_env,
    local_manifest_digest,
    worker_binary,
)
from meshnet.local.vulkan import DRIVER_CHOICE, VISIBLE, software_device_env
from meshnet.native.build import build_worker
from meshnet.native.bundle import bundle_worker
from meshnet.native.flags import DOC, worker_flags
from meshnet.paths import repo_root, workspace
from meshnet.pin.build import build_dir_for
from meshnet.pin.manifest import load_manifest
from meshnet.pin.workspace import Workspace
from meshnet.route.drafts import MAX_DRAFT, MAX_WINDOWS


@click.group("worker")
def command() -> None:
    """The C++ shard worker (meshnet-shard-worker) and its tools."""


@command.command("build")
@lane_option
@click.option("--dev", is_flag=True, help="Incremental build in the workspace (no cache key).")
@click.option(
    "--jobs", "-j", type=click.IntRange(1, 256), default=None, help="Parallel compile jobs."
)
@portable_option
def build_cmd(lane: str, dev: bool, jobs: int | None, portable: bool) -> None:
    """Build worker/ against the pinned llama.cpp (cached by source digest)."""
    root = repo_root()
    manifest = load_manifest(root / "llama-pin.yaml")
    build_worker(root, manifest, Workspace(workspace(root)), lane, say, dev=dev, jobs=jobs,
                 portable=portable)


@command.command("bundle")
@lane_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory to write bin/, lib/ and BUNDLE.json to.")
def bundle_cmd(lane: str, out: Path) -> None:
    """Copy the portable worker build (`worker build --portable`) and its shared libraries
    into OUT, the way an image installs them under /usr/local."""
    root = repo_root()
    manifest = load_manifest(root / "llama-pin.yaml")
    worker = build_worker(root, manifest, Workspace(workspace(root)), lane, say, portable=True)
    bundle_worker(worker, build_dir_for(manifest, lane, portable=True) / "install", out, lane,
                  manifest.digest(), say)


@command.command("flags")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the table drifted.")
@click.option("--dev", is_flag=True, help="Ask the `worker build --dev` binary.")
def flags_cmd(check: bool, dev: bool) -> None:
    """Write docs/worker-flags.md's written blocks (the worker's flags and their bounds,
    `worker run`'s options and what it passes through, the flags the operator and meshnet up
    pass) from the built worker's --print-flags and the code that renders its callers'
    command lines; check that the prose says where each rendered flag comes from."""
    path = repo_root() / DOC
    doc = path.read_text()
    expected = worker_doc(doc, worker_flags(worker_binary(dev=dev)), run_cmd)
    unsaid = [f"{DOC}: '{RENDERED_SECTION}' does not say where {flag} comes from"
              for flag in unexplained(expected)]
    if check:
        report_drift([f"{DOC}: its written blocks differ from the worker's --print-flags and"
                      " its callers' renderers"] * (doc != expected) + unsaid,
                     "meshnet worker flags", "the worker flag docs are up to date")
        return
    path.write_text(expected)
    click.echo(f"wrote {path}")
    report_drift(unsaid, "meshnet worker flags", "every rendered flag is explained")


def _operator_recipe_digest(lane: str, boundary_dtype: str, ctx: int, slots: int) -> str:
    """The recipeDigest the operator gives a route of this recipe on this pin (the
    planner's identity), so that a hand-started worker can stand in for its stage. Built
    unvalidated: flags no route may have (e.g. --ctx below 16) still get a digest."""
    recipe = Recipe.model_construct(lane=lane, boundary_dtype=boundary_dtype,
                                    context_length=ctx, session_slots=slots)
    pin = load_manifest(repo_root() / "llama-pin.yaml").digest()
    return digests.recipe_digest(pin, recipe.identity())


@command.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              required=True, help="GGUF file (the first file of a split set).")
@click.option("--layers", required=True, metavar="BEGIN:END",
              help="Owned layer range [BEGIN, END).")
@click.option("--route-id", default="local", show_default=True,
              help="Route every request must name.")
@click.option("--epoch", type=click.IntRange(0), default=1, show_default=True)
@click.option("--listen", default="127.0.0.1:50051", show_default=True, help="gRPC address.")
@click.option("--metrics-listen", default="127.0.0.1:9464", show_default=True,
              help="Prometheus /metrics address ('' disables).")
@click.option("--slots", type=click.IntRange(1), default=4, show_default=True)
@click.option("--ctx", type=click.IntRange(1), default=4096, show_default=True,
              help="Context length per session.")
@click.option("--batch", type=click.IntRange(1), default=512, show_default=True,
              help="Most tokens per engine step.")
@click.option("--threads", type=click.IntRange(0), default=0, show_default=True,
              help="0: all cores.")
@click.option("--boundary-dtype", type=click.Choice(["f32", "f16", "bf16"]), default="f32",
              show_default=True)
@click.option("--manifest-digest", default=None, help="Default: hashed from the model file(s).")
@click.option("--recipe-digest", default=None,
              help="Default: the operator's for a route of this lane, --boundary-dtype, --ctx "
                   "and --slots on this checkout's pin.")
@click.option("--route-digest", default="")
@click.option("--evict-idle-ms", type=click.IntRange(0), default=None)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Require client certificates signed by this CA (mTLS).")
@click.option("--next-stage", default="", metavar="HOST:PORT",
              help="Chain topology: relay steps to this stage (the next range).")
@click.option("--ring-last", default="", metavar="HOST:PORT",
              help="Ring topology, on the first stage: take the route's last stage's sampled "
                   "tokens straight (S network legs per decoded token instead of 2(S-1)).")
@click.option("--next-stage-ca", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The CA that signed the next stage's certificate: the link to it is TLS "
                   "(default: --tls-client-ca). Needed with --tls-cert and --next-stage.")
@click.option("--local-relay/--no-local-relay", default=True, show_default=True,
              help="Without TLS: relay steps between stages on this host over a plain "
                   "127.0.0.1 socket instead of gRPC (several times cheaper per token).")
@click.option("--pipeline-depth", type=click.IntRange(0), default=0, show_default=True,
              help="Stages in the route: concurrent sessions run as that many groups, so "
                   "every stage computes one (0: the model's layers / this stage's layers).")
@click.option("--max-loop-drafts", type=click.IntRange(0, MAX_DRAFT), default=None,
              help="First stage: a speculative decode loop drafts at most N tokens per verify "
                   "window (0: loops decode plainly). Default: the worker's (7).")
@click.option("--max-loop-windows", type=click.IntRange(1, MAX_WINDOWS), default=None,
              help="First stage: a speculative decode loop keeps at most N verify windows in "
                   "flight. Default: the worker's (8).")
@click.option("--discard-depth", type=click.IntRange(0), default=None,
              help="deepseek4: keep N rollback snapshots per session, so that speculation can "
                   "drop up to N rejected positions at once (windows x (drafts + 1) - 1). "
                   "Default: 0, no speculation on deepseek4.")
@click.option("--cpus", default="", metavar="LIST",
              help="Bind the engine's compute threads to these CPUs, in order (e.g. 0,1); "
                   "the worker's other threads stay on the first. Default: unbound.")
@click.option("--gpu-layers", type=click.IntRange(0), default=0, show_default=True,
              help="Offload this many of the model's last layers to the lane's device "
                   "(99: all). On the vulkan lane a host whose only Vulkan device is Mesa's "
                   "software one (lavapipe) runs on it: the lane's pinned lavapipe once "
                   "`meshnet pin build --lane vulkan` unpacked it (GGML_VK_VISIBLE_DEVICES, "
                   "VK_DRIVER_FILES, unless set).")
@click.option("--dev", is_flag=True, help="Run the `worker build --dev` binary.")
@lane_option
@click.argument("worker_args", nargs=-1, type=click.UNPROCESSED, metavar="[WORKER FLAGS]...")
def run_cmd(model: Path, layers: str, route_id: str, epoch: int, listen: str, metrics_listen: str,
            slots: int, ctx: int, batch: int, threads: int, boundary_dtype: str,
            manifest_digest: str | None, recipe_digest: str | None, route_digest: str,
            evict_idle_ms: int | None, tls_cert: str | None, tls_key: str | None,
            tls_client_ca: str | None, next_stage: str, ring_last: str,
            next_stage_ca: str | None, local_relay: bool, pipeline_depth: int,
            max_loop_drafts: int | None, max_loop_windows: int | None,
            discard_depth: int | None, cpus: str, gpu_layers: int, dev: bool,
            lane: str, worker_args: tuple[str, ...]) -> None:
    """Start a built meshnet-shard-worker serving LAYERS of MODEL (replaces this process).

    Any other flag of the worker (docs/worker-flags.md, e.g. --prefix-cache-entries 64)
    passes through to it unchanged, checked by the worker's own parser first."""
    try:
        span = LayerRange.parse(layers)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--layers") from None
    try:
        cpu_list = tuple(int(cpu) for cpu in cpus.split(",") if cpu.strip())
    except ValueError:
        raise click.BadParameter("expected CPU numbers separated by commas, e.g. 0,1",
                                 param_hint="--cpus") from None
    try:
        cpu_binding_env(cpu_list)  # refuse unusable CPUs before hashing the model
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cpus") from None
    if recipe_digest is None:
        recipe_digest = _operator_recipe_digest(lane, boundary_dtype, ctx, slots)
    spec = LaunchSpec(
        model=model, layers=span, route_id=route_id, epoch=epoch, listen=listen,
        metrics_listen=metrics_listen, slots=slots, ctx=ctx, batch=batch, threads=threads,
        boundary_dtype=boundary_dtype,
        manifest_digest=manifest_digest or local_manifest_digest(model),
        recipe_digest=recipe_digest, route_digest=route_digest, evict_idle_ms=evict_idle_ms,
        tls_cert=Path(tls_cert) if tls_cert else None,
        tls_key=Path(tls_key) if tls_key else None,
        tls_client_ca=Path(tls_client_ca) if tls_client_ca else None,
        next_stage=next_stage, ring_last=ring_last,
        next_stage_ca=Path(next_stage_ca) if next_stage_ca else None,
        local_relay=local_relay, pipeline_depth=pipeline_depth, cpus=cpu_list,
        max_loop_drafts=max_loop_drafts, max_loop_windows=max_loop_windows,
        discard_depth=discard_depth, gpu_layers=gpu_layers,
    )
    binary = worker_binary(dev=dev, lane=lane)
    argv = [*spec.args(), *_passed_through(binary, spec.args(), list(worker_args))]
    environment = spec.environment()
    device = "".join(f"{name}={environment[name]} " for name in (VISIBLE, DRIVER_CHOICE[0])
                     if name in environment)
    click.echo(f"[worker] {device}{binary} {' '.join(argv)}", err=True)
    os.execve(binary, [str(binary), *argv], environment)


@command.command("device-env")
def device_env_cmd() -> None:
    """Print, as NAME=value lines for `env`, what a vulkan-lane worker started here is given
    to run on this host's device: on a host whose only Vulkan device is a software one, that
    device and the lane's pinned lavapipe (nothing on a host with a GPU)."""
    for name, value in software_device_env(os.environ).items():
        click.echo(f"{name}={value}")


def _passed_through(binary: Path, rendered: list[str], extra: list[str]) -> list[str]:
    """`extra`, the flags `worker run` does not spell itself, once the worker's own parser
    (--check-args: no model loaded, no port opened) accepts them beside the rendered ones."""
    if not extra:
        return []
    twice = sorted({a for a in extra if a.startswith("--")} & {a for a in rendered
                                                               if a.startswith("--")})
    if twice:
        raise click.UsageError(f"{', '.join(twice)}: set by `meshnet worker run`'s own"
                               " option of that name; give it once, before the worker flags")
    checked = subprocess.run([str(binary), "--check-args", *rendered, *extra],
                             capture_output=True, text=True, timeout=30)
    if checked.returncode != 0:
        raise click.UsageError(f"the worker refuses {' '.join(extra)!r}: "
                               f"{checked.stderr.strip() or checked.stdout.strip()}")
    return extra
