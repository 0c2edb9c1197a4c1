"""Apply our numbered patch stack onto a clean copy of the verified tree."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from meshnet.errors import PinError
from meshnet.pin.gittree import git
from meshnet.pin.manifest import (
    PatchEntry,
    PinManifest,
    load_manifest,
    sha256_file,
    write_patch_list,
)
from meshnet.pin.workspace import Workspace

Say = Callable[[str], None]
BASE_TAG = "meshnet-base"


def check_patch_files(manifest: PinManifest, patches_dir: Path) -> list[Path]:
    """Every listed patch exists and has its manifest sha256; refuse otherwise."""
    files = []
    for entry in manifest.patches:
        path = patches_dir / entry.name
        if not path.is_file():
            raise PinError(f"patch {entry.name} is listed in llama-pin.yaml but missing")
        actual = sha256_file(path)
        if actual != entry.sha256:
            raise PinError(
                f"patch {entry.name}: sha256 mismatch: expected {entry.sha256} (llama-pin.yaml), "
                f"actual {actual}. Refusing to apply a patch that differs from the manifest."
            )
        files.append(path)
    return files


def applied_state(manifest: PinManifest) -> dict[str, object]:
    return {"tree": manifest.upstream.tree, "patches": [p.sha256 for p in manifest.patches]}


def has_local_work(ws: Workspace) -> bool:
    """True when the patched checkout holds commits or edits that `patch` did not make
    (an outdated stack that `patch` applied itself is not local work)."""
    if not (ws.patched / ".git").exists():
        return False
    dirty = git("-C", str(ws.patched), "status", "--porcelain", "--untracked-files=no")
    ahead = int(git("-C", str(ws.patched), "rev-list", "--count", f"{BASE_TAG}..HEAD"))
    applied = ws.read_marker(ws.patched_marker).get("patches")
    return bool(dirty) or not isinstance(applied, list) or ahead != len(applied)


def apply_patches(
    manifest: PinManifest, ws: Workspace, patches_dir: Path, say: Say, force: bool = False
) -> bool:
    """Make `ws.patched` the pinned tree plus the stack; return False when already so."""
    files = check_patch_files(manifest, patches_dir)
    if not ws.pristine.exists():
        raise PinError("no fetched llama.cpp tree: run `meshnet pin fetch` first")
    state = applied_state(manifest)
    local_work = has_local_work(ws)
    if (
        (ws.patched / ".git").exists()
        and not local_work
        and (ws.read_marker(ws.patched_marker) == state)
    ):
        say(f"patch stack ({len(files)} patches) already applied")
        return False
    if local_work and not force:
        raise PinError(
            f"{ws.patched} has commits or edits that are not in the patch stack; "
            "export them with `meshnet pin export-patches` or pass --force to discard them"
        )
    say(f"copying the verified tree to {ws.patched} ...")
    ws.patched_marker.unlink(missing_ok=True)
    shutil.rmtree(ws.patched, ignore_errors=True)
    shutil.copytree(ws.pristine, ws.patched, symlinks=True)
    git("init", "-q", str(ws.patched))
    git("-C", str(ws.patched), "add", "-A", "-f", ".")
    git(
        "-C",
        str(ws.patched),
        "commit",
        "-q",
        "--no-verify",
        "-m",
        f"llama.cpp {manifest.upstream.commit} (pinned tree {manifest.upstream.tree})",
    )
    base_tree = git("-C", str(ws.patched), "rev-parse", "HEAD^{tree}")
    if base_tree != manifest.upstream.tree:
        raise PinError(
            f"the copy of the verified tree hashes to {base_tree}, expected "
            f"{manifest.upstream.tree}: run `meshnet pin fetch --force`"
        )
    git("-C", str(ws.patched), "tag", BASE_TAG)
    for path in files:
        say(f"applying {path.name}")
        try:
            git("-C", str(ws.patched), "am", "-3", "--keep-cr", str(path))
        except PinError as exc:
            raise PinError(f"patch {path.name} does not apply: {exc}") from exc
    ws.write_marker(ws.patched_marker, state)
    say(f"applied {len(files)} patches onto tree {manifest.upstream.tree}")
    return True


def export_patches(
    manifest_path: Path, ws: Workspace, patches_dir: Path, say: Say
) -> list[PatchEntry]:
    """Turn the commits on top of the base in the workspace into `patches/` + manifest entries."""
    if not (ws.patched / ".git").exists():
        raise PinError("no patched workspace: run `meshnet pin patch` first")
    if git("-C", str(ws.patched), "status", "--porcelain", "--untracked-files=no"):
        raise PinError(f"{ws.patched} has uncommitted edits: commit them there first")
    for old in patches_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"):
        old.unlink()
    patches_dir.mkdir(parents=True, exist_ok=True)
    git(
        "-C",
        str(ws.patched),
        "format-patch",
        "-q",
        "--zero-commit",
        "--no-numbered",
        "--no-signature",
        "--full-index",
        "-o",
        str(patches_dir.resolve()),
        f"{BASE_TAG}..HEAD",
    )
    entries = [
        PatchEntry(name=path.name, sha256=sha256_file(path))
        for path in sorted(patches_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"))
    ]
    write_patch_list(manifest_path, entries)
    ws.write_marker(ws.patched_marker, applied_state(load_manifest(manifest_path)))
    for entry in entries:
        say(f"{entry.name}  {entry.sha256}")
    return entries
