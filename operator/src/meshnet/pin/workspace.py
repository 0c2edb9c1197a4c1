"""The ignored workspace layout: pristine tree, patched checkout, build link, markers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def pristine(self) -> Path:
        """The verified, unmodified upstream tree."""
        return self.root / "llama.cpp-pristine"

    @property
    def pristine_marker(self) -> Path:
        return self.root / "llama.cpp-pristine.json"

    @property
    def patched(self) -> Path:
        """A git checkout of the pristine tree with our patch stack applied as commits."""
        return self.root / "llama.cpp"

    @property
    def patched_marker(self) -> Path:
        return self.root / "llama.cpp.json"

    def link(self, name: str, target: Path) -> None:
        """Atomically point `<workspace>/<name>` at `target` (a cached build)."""
        self.root.mkdir(parents=True, exist_ok=True)
        link = self.root / name
        tmp = link.with_name(link.name + ".tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        tmp.replace(link)

    def read_marker(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write_marker(self, path: Path, data: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
