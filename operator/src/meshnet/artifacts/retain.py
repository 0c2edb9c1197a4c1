"""Each manifest's own folder of its verified files: `DEST/.meshnet/manifests/<digest>/`.

A pull replaces a changed file in place by renaming verified bytes over it. Workers of the
epoch that ran on the old bytes may still be restarted (a crash, make-before-break while
the next epoch starts), and must load the bytes of their own manifest. So each manifest's
files are hard-linked, once verified, into a folder of that manifest: retained by content
(a link, no copy; the destination is one filesystem), under the names a split GGUF set
needs beside each other. Workers start from their manifest's folder; a folder goes once no
epoch uses its manifest, and with it the last name of bytes that were replaced.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

from meshnet.artifacts.markers import Layout, check_file_names, make_private_dir


def manifest_folder(layout: Layout, digest: str) -> Path:
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"not a manifest digest: {digest!r}")
    return layout.state / "manifests" / digest


def keep_manifest(layout: Layout, digest: str, names: Iterable[str]) -> Path:
    """Link the files `names`, just verified in the destination, into the folder of the
    manifest `digest` (replacing links to earlier bytes of the same names); the folder.
    Raises OSError where the storage has no hard links."""
    folder = manifest_folder(layout, digest)
    make_private_dir(folder)
    for name in names:
        check_file_names([name])
        source, link = layout.final(name), folder / name
        with suppress(FileNotFoundError):
            if os.path.samefile(source, link):
                continue
        staged = folder / f"{name}.link"
        with suppress(FileNotFoundError):
            staged.unlink()
        os.link(source, staged, follow_symlinks=False)
        os.replace(staged, link)
    return folder


def prune_manifests(layout: Layout, digests: Iterable[str]) -> None:
    """Remove the folders of the manifests `digests` (no epoch uses them any more)."""
    for digest in digests:
        shutil.rmtree(manifest_folder(layout, digest), ignore_errors=True)
