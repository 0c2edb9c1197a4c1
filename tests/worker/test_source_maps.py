"""The worker's folders carry a file map (README.md) a newcomer reads as the architecture:
every source file has its row, and no row names a file that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parents[2] / "worker"
ROW = re.compile(r"^\| `([\w.*]+)` \|", re.MULTILINE)


def mapped(folder: Path) -> set[str]:
    """The modules the map's rows name: `name.*` (header and source) or a file."""
    return {name.removesuffix(".*").removesuffix(".h").removesuffix(".cpp")
            for name in ROW.findall((folder / "README.md").read_text())}


def modules(folder: Path) -> set[str]:
    return {path.stem for path in folder.iterdir() if path.suffix in (".h", ".cpp")}


# Every folder of the worker's sources: service/'s rooms by concern, and engine/.
FOLDERS = sorted({str(path.parent.relative_to(WORKER))
                  for path in WORKER.glob("*/**/*.*") if path.suffix in (".h", ".cpp")
                  and "tests" not in path.parts and "tools" not in path.parts})


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_source_file_of_a_worker_folder_has_its_row_in_the_map(folder: str) -> None:
    where = WORKER / folder
    assert modules(where), where
    assert sorted(modules(where) - mapped(where)) == [], f"{folder}/README.md lacks rows"
    assert sorted(mapped(where) - modules(where)) == [], f"{folder}/README.md names gone files"


def test_the_service_map_names_each_room_and_keeps_no_source_of_its_own() -> None:
    service = WORKER / "service"
    rooms = {path.name for path in service.iterdir() if path.is_dir()}
    named = set(re.findall(r"^\| \[`(\w+)/`\]", (service / "README.md").read_text(), re.MULTILINE))
    assert rooms and named == rooms
    assert modules(service) == set(), "service/'s sources belong in its rooms"
