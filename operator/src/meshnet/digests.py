"""Digests of content (docs/architecture.md, identities): same inputs give the same digest,
anywhere."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any


def canonical_digest(value: Any) -> str:
    """sha256 of the canonical JSON form (sorted keys, no spaces)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def manifest_digest(files: Iterable[tuple[str, int, str]]) -> str:
    """Artifact identity over (name, size, sha256) of every file, sorted by name."""
    entries = [
        {"name": name, "size": int(size), "sha256": sha.lower()}
        for name, size, sha in sorted(files, key=lambda item: item[0])
    ]
    return canonical_digest({"files": entries})


def recipe_digest(pin_digest: str, recipe: Mapping[str, Any]) -> str:
    """Recipe identity: the llama.cpp pin (commit, tree, patch stack) plus every
    recipe field that can change numerics or capacity (lane, boundary dtype,
    context length, session slots, engine flags)."""
    return canonical_digest({"pin": pin_digest, "recipe": dict(recipe)})


def route_digest(manifest: str, recipe: str, ranges: Iterable[tuple[int, int]]) -> str:
    """Route identity over the artifact, the recipe and the ordered stage ranges."""
    return canonical_digest(
        {"manifest": manifest, "recipe": recipe, "stages": [[b, e] for b, e in ranges]}
    )
