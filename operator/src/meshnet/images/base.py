"""A Debian bookworm base image made here, for when no registry can give us one: debootstrap
a minimal root filesystem from the Debian archive apt already uses, then commit it with
buildah as localhost/meshnet/debian:bookworm. Rebuilt only when its recipe changes."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from meshnet.images import buildah
from meshnet.images.buildah import ImageError

Say = Callable[[str], None]
SUITE = "bookworm"
LOCAL_BASE = f"localhost/meshnet/debian:{SUITE}"
DIGEST_LABEL = "dev.meshnet.inputs"
# minbase: dpkg, apt and the required packages (useradd included), as Debian's own slim
# image; the Dockerfiles install the rest with apt-get like on any Debian base.
VARIANT = "minbase"
# What a container needs beside the root filesystem of a chroot: apt's lists and caches
# are left out as in Debian's images, the rest is theirs.
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DROPPED = ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf/templates.dat-old",
           "var/log", "usr/share/doc", "usr/share/man", "usr/share/locale")


def recipe_digest() -> str:
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "debootstrap"],
                             capture_output=True, text=True).stdout.strip()
    recipe = {"suite": SUITE, "variant": VARIANT, "debootstrap": version, "dropped": DROPPED}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:20]


def ensure_local_base(say: Say, mirror: str | None = None) -> str:
    """The local base image's name, debootstrapped and committed unless already there."""
    digest = recipe_digest()
    if buildah.image_labels(LOCAL_BASE).get(DIGEST_LABEL) == digest:
        say(f"base {LOCAL_BASE}: cached")
        return LOCAL_BASE
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed: run `make deps` (Debian package "
                         "debootstrap), or pass --base IMAGE where a registry is reachable")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="meshnet-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        say(f"debootstrap --variant={VARIANT} {SUITE} (about a minute) ...")
        result = subprocess.run(
            ["debootstrap", f"--variant={VARIANT}", SUITE, str(rootfs),
             *([mirror] if mirror else [])],
            capture_output=True, text=True)
        if result.returncode != 0:
            raise ImageError("debootstrap failed:\n" + "\n".join(
                (result.stdout + result.stderr).splitlines()[-20:]))
        for part in DROPPED:
            target = rootfs / part
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        container = buildah.run("from", "scratch").strip()
        try:
            mount = Path(buildah.run("mount", container).strip())
            subprocess.run(["cp", "-a", f"{rootfs}/.", str(mount)], check=True)
            buildah.run("umount", container)
            buildah.run("config", "--label", f"{DIGEST_LABEL}={digest}", "--env", f"PATH={PATH}",
                        "--cmd", "/bin/bash", container)
            buildah.run("commit", "--rm", container, LOCAL_BASE)
        except BaseException:
            subprocess.run(buildah.command("rm", container), capture_output=True)
            raise
    say(f"base {LOCAL_BASE}: built in {time.monotonic() - started:.0f}s")
    return LOCAL_BASE
