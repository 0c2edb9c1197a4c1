"""The README's artifact commands, run as written: only the URL and the destination are
pointed at this test's HTTP server and folder, so the test fails when the README drifts."""

from __future__ import annotations

import glob
import shlex
import shutil
from pathlib import Path

from meshnet.paths import repo_root

from .conftest import SplitSet

README_URL = "https://models.example.com/x/"
README_DEST = "/var/lib/models/x"


def readme_artifact_commands() -> list[str]:
    """The `meshnet artifact ...` lines of the README's tour, in order."""
    lines = (repo_root() / "README.md").read_text().splitlines()
    return [line.strip() for line in lines if line.strip().startswith("meshnet artifact ")]


def test_the_readme_manifest_pull_verify_sequence_works_verbatim(split_set: SplitSet, serve,
                                                                 meshnet, tmp_path: Path):
    commands = readme_artifact_commands()
    assert [shlex.split(c)[2] for c in commands] == ["manifest", "pull", "verify"], commands
    assert README_URL in commands[0] and all(README_DEST in c for c in commands[1:]), commands
    # The README's model-*.gguf: the SmolLM2 split set under that prefix, in the working dir.
    work, served = tmp_path / "work", tmp_path / "served"
    work.mkdir()
    served.mkdir()
    for file in split_set.files:
        renamed = file.name.replace("smollm2-", "model-")
        shutil.copy(file, work / renamed)
        shutil.copy(file, served / renamed)
    server, url = serve(served)
    dest = tmp_path / "models"

    for command in commands:
        command = command.replace(README_URL, url).replace(README_DEST, str(dest))
        args = [expanded for word in shlex.split(command)[1:]
                for expanded in (sorted(glob.glob(word, root_dir=work)) or [word])]
        result = meshnet(*args, cwd=work)
        assert result.returncode == 0, f"{command}\n{result.stderr}"

    assert sorted(p.name for p in dest.glob("*.gguf")) == sorted(
        p.name for p in work.glob("model-*.gguf"))
    assert "architecture       llama" in result.stdout  # verify's facts
    assert "blocks             30" in result.stdout
    assert server.bytes_sent == split_set.total
