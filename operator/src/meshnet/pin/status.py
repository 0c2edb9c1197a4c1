"""What the workspace holds now, compared with the pin."""

from __future__ import annotations

from typing import Any

from meshnet.pin.build import build_dir_for
from meshnet.pin.manifest import PinManifest
from meshnet.pin.patch import applied_state
from meshnet.pin.workspace import Workspace


def pin_status(manifest: PinManifest, ws: Workspace, lane: str) -> dict[str, Any]:
    fetched = ws.read_marker(ws.pristine_marker)
    patched = ws.read_marker(ws.patched_marker) == applied_state(manifest)
    build_dir = build_dir_for(manifest, lane)
    return {
        "repository": manifest.upstream.repository,
        "commit": manifest.upstream.commit,
        "tree": manifest.upstream.tree,
        "fetched": bool(fetched) and ws.pristine.exists(),
        "source": fetched.get("source"),
        "patches": [
            {"name": p.name, "sha256": p.sha256, "applied": patched} for p in manifest.patches
        ],
        "patched": patched and ws.patched.exists(),
        "lane": lane,
        "build_dir": str(build_dir),
        "built": (build_dir / "complete.json").exists(),
        "prefix": str(build_dir / "install"),
        "workspace": str(ws.root),
        "pin_digest": manifest.digest(),
    }


def format_status(status: dict[str, Any]) -> str:
    yes = {True: "yes", False: "no"}
    lines = [
        f"llama.cpp   {status['repository']}",
        f"commit      {status['commit']}",
        f"tree        {status['tree']}",
        f"fetched     {yes[status['fetched']]}"
        + (f" (from {status['source']})" if status["source"] else ""),
        f"patches     {len(status['patches'])} in stack, "
        + ("applied" if status["patched"] else "not applied"),
        *[f"  {p['name']}  {p['sha256'][:16]}" for p in status["patches"]],
        f"lane        {status['lane']}",
        f"build       {status['build_dir']} ({'built' if status['built'] else 'not built'})",
        f"pin digest  {status['pin_digest']}  (enters the recipe identity)",
    ]
    return "\n".join(lines)
