"""`meshnet images`: build the container images with buildah and save them for a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import click

from meshnet.cli.pin import say as pin_say
from meshnet.images import buildah
from meshnet.images.build import (
    IMAGES,
    BuiltImage,
    build_image,
    default_images,
    local_name,
    order,
    python_context,
    resolve_base,
    tag,
)
from meshnet.images.worker_context import portable_built, worker_context
from meshnet.paths import repo_root, workspace


def say(message: str) -> None:
    click.echo(f"[images] {message}", err=True)


@click.group("images")
def command() -> None:
    """Container images: the operator, and per lane the worker and its certification image.

    Built with buildah (root, chroot isolation, vfs storage: no container engine needed)
    from images/*.Dockerfile, tagged as the chart's defaults expect (its appVersion), and
    cached: an image whose inputs did not change is not built again.
    """


@command.command("build")
@click.option("--only", "only", multiple=True, type=click.Choice(sorted(IMAGES)),
              help="Build just this image (and what it needs); repeatable. Default: the "
                   "operator and the cpu images, and a GPU lane's where its portable build "
                   "exists here.")
@click.option("--base", default="auto", show_default=True, metavar="auto|local|IMAGE",
              help="Base of every image: `local` debootstraps Debian bookworm here; IMAGE "
                   "names one buildah can find or pull (e.g. debian:bookworm-slim); `auto` "
                   "uses debian:bookworm-slim when the store holds it, else `local`.")
@click.option("--force", is_flag=True, help="Build even when an image with these inputs exists.")
@click.option("--jobs", "-j", type=click.IntRange(1, 256), default=None,
              help="Parallel compile jobs of the portable build.")
@click.option("--json", "as_json", is_flag=True, help="Print what was built as JSON.")
def build_cmd(only: tuple[str, ...], base: str, force: bool, jobs: int | None,
              as_json: bool) -> None:
    """Build the images (portable worker build first, when an image needs it)."""
    root = repo_root()
    names = order(only or default_images(lambda lane: portable_built(root, lane)))
    contexts = workspace(root) / "images"
    base_image, pull = resolve_base(base, say)
    built: dict[str, BuiltImage] = {}
    for name in names:
        spec = IMAGES[name]
        context = contexts / name
        if spec.context == "worker-bundle":
            worker_context(root, spec.lane, context, jobs, pin_say)
        else:
            python_context(root, context)
        built[name] = build_image(root, spec, context, base_image, pull, built, say, force)
    if as_json:
        click.echo(json.dumps({name: {"tag": b.tag, "bytes": b.size, "seconds": round(b.seconds, 1),
                                      "cached": b.cached} for name, b in built.items()}, indent=2))


@command.command("save")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for one docker-archive tarball per image.")
@click.option("--only", "only", multiple=True, type=click.Choice(sorted(IMAGES)))
def save_cmd(out: Path, only: tuple[str, ...]) -> None:
    """Write the built images as docker-archive tarballs (for `kind load image-archive`,
    `ctr -n k8s.io images import`, `docker load`), named as the chart expects. Default:
    every image the store holds."""
    root = repo_root()
    out.mkdir(parents=True, exist_ok=True)
    names = only or [name for name, spec in IMAGES.items()
                     if buildah.image_info(local_name(tag(root, spec)))]
    for name in names:
        reference = tag(root, IMAGES[name])
        target = out / f"{name}.tar"
        target.unlink(missing_ok=True)
        buildah.run("push", local_name(reference), f"docker-archive:{target}:{reference}")
        say(f"{name}: {target} ({target.stat().st_size / 1e6:.0f} MB)")

