"""`meshnet certify`: certify a route's lane (parity and useful speed against the unsplit
reference, run on this machine, and what the route promises: verify windows and sessions
at once that compute as alone) and record the certificate."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from meshnet.api.certification import MAX_WINDOW_ROWS, Certificate, CertifiedLane
from meshnet.certify import store
from meshnet.certify.gates import Gates
from meshnet.certify.hardware import local_gpu_product
from meshnet.certify.run import Reference, certify
from meshnet.certify.verdict import figures
from meshnet.cli.route_key import route_key_option
from meshnet.cli.tls import tls_client_options
from meshnet.errors import MeshnetError
from meshnet.local.process import worker_binary
from meshnet.local.registry import entry_route_key
from meshnet.route.route_key import RouteSecret
from meshnet.route.stage import TlsFiles
from meshnet.tracker.local import local_route

DEFAULTS = Gates()


def say(message: str) -> None:
    click.echo(f"[certify] {message}", err=True)


@click.command("certify")
@click.option("--route", "route_name", default=None, metavar="NAME",
              help="A route started by `meshnet up` here: stages, model, lane and digests"
                   " come from it and the certificate is kept on this machine.")
@click.option("--stage", "stages", multiple=True, metavar="HOST:PORT",
              help="A stage's gRPC endpoint, in pipeline order (instead of --route).")
@click.option("--model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="The GGUF the unsplit reference loads (with --stage).")
@click.option("--backend", type=click.Choice(["cpu", "cuda", "rocm", "vulkan"]),
              default="cpu", show_default=True, help="The route's lane (with --stage).")
@click.option("--gpu-product", default=None,
              help="GPU product of the stages' nodes (default: detected here; 'none' on cpu).")
@click.option("--manifest-digest", default=None, help="The artifact identity (with --stage).")
@click.option("--recipe-digest", default=None, help="The recipe identity (with --stage).")
@click.option("--route-digest", default=None, help="The route identity, for the record.")
@click.option("--epoch", type=click.IntRange(0), default=None, help="Its epoch, for the record.")
@click.option("--request", default=None, help="The recertify request this run answers.")
@click.option("--verify-rows", type=click.IntRange(1, MAX_WINDOW_ROWS), default=1,
              show_default=True,
              help="Rows of the route's verify windows (with --stage): speculation.maxDrafts"
                   " + 1 when it speculates; above 1, windows must compute bit for bit as"
                   " one-row steps.")
@click.option("--sessions", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Sessions the route runs at once (with --stage): its sessionSlots; above"
                   " 1, that many sessions at once must compute bit for bit as each alone.")
@click.option("--batching", type=click.Choice(["Exact", "Throughput"]), default="Exact",
              show_default=True,
              help="The route's recipe.batching (with --stage): Throughput batches as upstream"
                   " does, so its tokens may depend on the load and --sessions is not checked.")
@click.option("--tolerance", type=click.FloatRange(0.0), default=DEFAULTS.tolerance,
              show_default=True,
              help="Largest |delta logit| against the reference that passes; 0 demands"
                   " bit-identical logits, any other value makes the certificate say the"
                   " split is not exact.")
@click.option("--speed-fraction", type=click.FloatRange(0.0), default=DEFAULTS.speed_fraction,
              show_default=True, help="Decode tokens/s the route needs, as a fraction of the"
                                      " unsplit reference's.")
@click.option("--parity-steps", type=click.IntRange(0), default=DEFAULTS.parity_steps,
              show_default=True, help="Greedy steps compared after each prompt.")
@click.option("--speed-tokens", type=click.IntRange(2), default=DEFAULTS.speed_tokens,
              show_default=True, help="Tokens generated per speed measurement.")
@click.option("--repeats", type=click.IntRange(1), default=DEFAULTS.repeats, show_default=True,
              help="Speed measurements per side (the best counts).")
@click.option("--reference-threads", type=click.IntRange(0), default=None,
              help="CPU threads of the unsplit reference (default: the route's per worker).")
@click.option("--termination-log", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write the certificate here (a Job's termination log).")
@click.option("--json", "as_json", is_flag=True, help="Print the certificate as JSON.")
@tls_client_options
@route_key_option
def command(route_name: str | None, stages: tuple[str, ...], model: Path | None, backend: str,
            gpu_product: str | None, manifest_digest: str | None, recipe_digest: str | None,
            route_digest: str | None, epoch: int | None, request: str | None,
            verify_rows: int, sessions: int, batching: str, tolerance: float,
            speed_fraction: float, parity_steps: int, speed_tokens: int, repeats: int,
            reference_threads: int | None, termination_log: Path | None, as_json: bool,
            tls: TlsFiles | None, route_key: RouteSecret | None) -> None:
    """Certify a route's lane: the same tokens and logits as the unsplit model on a fixed
    prompt set, verify windows and sessions at once that compute as alone where the route
    promises them, and decode at least --speed-fraction of its speed, on this hardware.

    Exits 0 when the lane passed, 1 when it did not (the certificate says why).
    """
    if bool(stages) == bool(route_name):
        raise click.UsageError("give either --route NAME or one --stage per stage")
    gates = Gates(tolerance=tolerance, speed_fraction=speed_fraction, parity_steps=parity_steps,
                  speed_tokens=speed_tokens, repeats=repeats)
    threads = reference_threads or 0
    if route_name is not None:
        local = local_route(route_name)
        if local.lane is None:
            raise MeshnetError(f"route {route_name} has no manifest/recipe digest yet")
        lane, endpoints, model = local.lane, local.endpoints, local.model
        route_digest, epoch = local.entry.get("routeDigest"), local.entry.get("epoch")
        route_key = route_key or entry_route_key(local.entry)
        threads = reference_threads if reference_threads is not None else int(
            local.entry.get("threads") or 0)
    else:
        if model is None or not manifest_digest or not recipe_digest:
            raise click.UsageError("--stage needs --model, --manifest-digest and --recipe-digest")
        lane = CertifiedLane(backend=backend,  # type: ignore[arg-type]
                             gpu_product=gpu_product or local_gpu_product(backend),
                             manifest_digest=manifest_digest, recipe_digest=recipe_digest,
                             verify_rows=verify_rows, sessions=sessions,
                             batching=batching)  # type: ignore[arg-type]
        endpoints = list(stages)
    say(f"lane {lane.describe()}: {len(endpoints)} stages")
    certificate = certify(endpoints, lane, Reference(worker_binary(), model, threads), gates,
                          tls=tls, route_key=route_key, route_digest=route_digest, epoch=epoch,
                          request=request, say=say)
    if route_name is not None:
        say(f"recorded {store.save(certificate)}")
    _emit(certificate, as_json, termination_log)
    if not certificate.passed:
        sys.exit(1)


def _emit(certificate: Certificate, as_json: bool, termination_log: Path | None) -> None:
    if termination_log is not None:  # compact: a termination message holds 4096 bytes
        termination_log.write_text(certificate.model_dump_json(by_alias=True))
    if as_json:
        click.echo(certificate.model_dump_json(by_alias=True, indent=2))
        return
    click.echo(f"lane {certificate.lane.describe()}: "
               f"{'PASSED' if certificate.passed else 'FAILED'}")
    for figure in figures(certificate).split("; "):
        click.echo(f"  {figure}")
    for failure in certificate.failures:
        click.echo(f"  failed: {failure}")
