"""The worker bundle an image ships (`meshnet worker bundle`): a portable worker build's
binaries in bin/ with ggml's backend modules beside them (where ggml's loader looks),
llama.cpp's shared libraries in lib/ (the binaries' RPATH is $ORIGIN/../lib), and
BUNDLE.json saying what it holds. Copy bin/ and lib/ under one prefix, e.g. /usr/local."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshnet.buildsteps.cmake import BuildError
from meshnet.native.build import WorkerBuild

Say = Callable[[str], None]
BINARIES = ("meshnet-shard-worker", "meshnet-reference-generate")
LIBRARIES = ("libllama.so*", "libggml.so*", "libggml-base.so*")


def bundle_worker(worker: WorkerBuild, llama_prefix: Path, out: Path, lane: str,
                  pin_digest: str, say: Say) -> dict[str, Any]:
    """Writes the bundle to `out` (its bin/ and lib/ are replaced); returns BUNDLE.json."""
    modules = sorted((llama_prefix / "bin").glob("libggml-*.so"))
    if not modules:
        raise BuildError(f"{llama_prefix} has no backend modules: not a portable build")
    bin_dir, lib_dir = out / "bin", out / "lib"
    for part in (bin_dir, lib_dir):
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
    for name in BINARIES:
        _copy_stripped(worker.bin_dir / name, bin_dir / name)
    for module in modules:
        _copy_stripped(module, bin_dir / module.name)
    for pattern in LIBRARIES:
        for library in sorted(llama_prefix.glob(f"lib*/{pattern}")):
            if library.is_symlink():  # the soname links: keep them links
                (lib_dir / library.name).symlink_to(library.readlink())
            else:
                _copy_stripped(library, lib_dir / library.name)
    files = {str(p.relative_to(out)): p.stat().st_size
             for p in sorted(out.rglob("*")) if p.is_file() and not p.is_symlink()
             and p.name != "BUNDLE.json"}
    total = sum(files.values())
    summary: dict[str, Any] = {
        "lane": lane,
        "pin_digest": pin_digest,
        "cpu_variants": sorted(m.name[len("libggml-cpu-"):-len(".so")]
                               for m in modules if m.name.startswith("libggml-cpu-")),
        "bytes": total,
        "files": files,
    }
    (out / "BUNDLE.json").write_text(json.dumps(summary, indent=2) + "\n")
    say(f"bundled {len(files)} files, {total / 1e6:.1f} MB, in {out}")
    return summary


def _copy_stripped(source: Path, target: Path) -> None:
    """Without debug symbols: a third of the size (the build keeps the unstripped ones)."""
    shutil.copy2(source, target)
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", str(target)], check=True)
