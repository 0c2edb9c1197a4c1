"""Debian packages a lane's build reads but this system must not install (e.g. Vulkan
headers from a newer suite, whose binaries would pull a newer libc): `apt-get download`
through a private package list, the sha256 of llama-pin.yaml checked, `dpkg -x` into a
prefix under the build cache. Nothing under /etc, /var/lib/apt or /usr is touched."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from meshnet.errors import PinError
from meshnet.paths import cache_dir, cache_entry_lock
from meshnet.pin.manifest import DebianPackage, sha256_file

Say = Callable[[str], None]
APT_SOURCES = Path("/etc/apt")
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def unpacked(package: DebianPackage, say: Say) -> Path:
    """The package's files unpacked under the cache (fetched the first time): the prefix
    that holds its usr/."""
    entry = cache_dir() / "debian" / f"{package.package}_{package.version}-{package.sha256[:12]}"
    with cache_entry_lock(entry):
        if (entry / "complete").is_file():
            return entry / "root"
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        with tempfile.TemporaryDirectory(dir=entry) as scratch:
            deb = _download(package, Path(scratch), say)
            subprocess.run(["dpkg", "-x", str(deb), str(entry / "root")], check=True)
        (entry / "complete").write_text(package.sha256 + "\n")
        say(f"unpacked {deb.name} into {entry / 'root'}")
        return entry / "root"


def _download(package: DebianPackage, scratch: Path, say: Say) -> Path:
    mirror, keyring = debian_mirror()
    (scratch / "sources").mkdir()
    (scratch / "lists" / "partial").mkdir(parents=True)
    (scratch / "cache" / "archives" / "partial").mkdir(parents=True)
    (scratch / "sources" / f"{package.suite}.sources").write_text(
        f"Types: deb\nURIs: {mirror}\nSuites: {package.suite}\nComponents: main\n"
        f"Signed-By: {keyring}\n")
    apt = ["apt-get", "-q", "-o", "Dir::Etc::SourceList=/dev/null",
           "-o", f"Dir::Etc::SourceParts={scratch / 'sources'}",
           "-o", f"Dir::State::Lists={scratch / 'lists'}",
           "-o", f"Dir::Cache={scratch / 'cache'}"]
    if os.geteuid() == 0:  # apt's _apt user cannot write into a private scratch folder
        apt += ["-o", "APT::Sandbox::User=root"]
    say(f"fetching {package.package} {package.version} ({package.suite}) from {mirror} ...")
    _run([*apt, "update"], scratch, f"reading the {package.suite} package list")
    _run([*apt, "download", f"{package.package}={package.version}"], scratch,
         f"downloading {package.package} {package.version}")
    debs = list(scratch.glob(f"{package.package}_*.deb"))
    if len(debs) != 1:
        raise PinError(f"apt-get download left {len(debs)} {package.package} files in {scratch}")
    actual = sha256_file(debs[0])
    if actual != package.sha256:
        raise PinError(f"{debs[0].name}: sha256 {actual}, llama-pin.yaml says {package.sha256}: "
                       "refusing to use it")
    return debs[0]


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise PinError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def debian_mirror() -> tuple[str, str]:
    """The Debian archive this system already uses (its first `main` entry in
    /etc/apt), and the keyring that entry trusts: a newer suite is fetched from there.
    MESHNET_DEBIAN_MIRROR overrides the address."""
    override = os.environ.get("MESHNET_DEBIAN_MIRROR")
    for uri, suites, keyring in _apt_entries():
        if override or any(not suite.endswith("-security") for suite in suites):
            return override or uri, keyring or DEFAULT_KEYRING
    if override:
        return override, DEFAULT_KEYRING
    raise PinError("no Debian archive in /etc/apt to fetch from: set MESHNET_DEBIAN_MIRROR")


def _apt_entries() -> list[tuple[str, list[str], str]]:
    """(address, suites, Signed-By) of each Debian `main` entry, deb822 files first."""
    entries: list[tuple[str, list[str], str]] = []
    for path in sorted((APT_SOURCES / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(_deb822_fields(stanza))
            if "deb" in fields.get("Types", "").split() and \
                    "main" in fields.get("Components", "").split() and _is_debian(fields):
                for uri in fields.get("URIs", "").split():
                    entries.append((uri, fields.get("Suites", "").split(),
                                    fields.get("Signed-By", "")))
    one_line = [APT_SOURCES / "sources.list", *sorted((APT_SOURCES / "sources.list.d")
                                                      .glob("*.list"))]
    for path in one_line:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            match = re.match(r"deb\s+(?:\[(?P<opts>[^]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)"
                             r"\s+(?P<comps>.*)", line.strip())
            if match and "main" in match["comps"].split() and "/debian" in match["uri"]:
                keyring = re.search(r"signed-by=(\S+)", match["opts"] or "")
                entries.append((match["uri"], [match["suite"]],
                                keyring[1] if keyring else ""))
    return entries


def _deb822_fields(stanza: str) -> list[tuple[str, str]]:
    fields = []
    for line in stanza.splitlines():
        if line.startswith("#") or ":" not in line or line[:1].isspace():
            continue
        key, _, value = line.partition(":")
        fields.append((key.strip(), value.strip()))
    return fields


def _is_debian(fields: dict[str, str]) -> bool:
    """Debian's own archive (the debian-archive-keyring signs it), not a vendor's."""
    return "debian-archive-keyring" in fields.get("Signed-By", "") or \
        any(uri.rstrip("/").endswith("/debian") for uri in fields.get("URIs", "").split())

