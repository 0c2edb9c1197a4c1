"""`meshnet validate -f`: the CRDs' rules and the operator's cross-checks, offline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from meshnet.cli.main import cli
from meshnet.paths import repo_root

MakeArtifact = MakeRoute = Callable[..., dict[str, Any]]  # fixtures from conftest.py


def validate(*files: Path) -> tuple[int, str]:
    args = ["validate"] + [arg for f in files for arg in ("-f", str(f))]
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output


def write(path: Path, *docs: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_the_cluster_examples_are_valid() -> None:
    examples = sorted((repo_root() / "examples").glob("*.yaml"))
    assert examples
    code, output = validate(*examples)
    assert code == 0, output
    assert output.count("valid    ") == len(examples)


def test_a_route_beyond_its_artifacts_block_count_fails_with_the_field_path(
        tmp_path: Path, make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    artifact = write(tmp_path / "artifact.yaml", make_artifact(block_count=24))
    route = write(tmp_path / "route.yaml", make_route())
    code, output = validate(artifact, route)
    assert code == 1
    assert "invalid  " in output and "ShardRoute/r1" in output
    assert ("spec.stages[2].layers: stage 's2' ends at layer 30 but the artifact has only"
            " 24 blocks") in output


def test_a_route_that_stops_short_of_its_artifacts_block_count_fails_naming_the_layers(
        tmp_path: Path, make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    artifact = write(tmp_path / "artifact.yaml", make_artifact(block_count=30))
    route = write(tmp_path / "route.yaml", make_route(ranges=[(0, 15), (15, 28)]))
    code, output = validate(artifact, route)
    assert code == 1
    assert ("spec.stages[1].layers: stage 's1' ends at layer 28 but the artifact has 30 blocks:"
            " layers [28, 30) would never run") in output


def test_a_route_whose_first_stage_does_not_begin_at_layer_0_fails_even_alone(
        tmp_path: Path, make_route: MakeRoute) -> None:
    code, output = validate(write(tmp_path / "route.yaml", make_route(ranges=[(1, 30)])))
    assert code == 1
    assert "spec.stages: the first stage must begin at layer 0" in output


def test_without_its_artifact_a_route_is_checked_on_its_own(
        tmp_path: Path, make_route: MakeRoute) -> None:
    code, output = validate(write(tmp_path / "route.yaml", make_route()))
    assert code == 0, output


def test_every_problem_of_every_document_is_printed_and_other_kinds_are_skipped(
        tmp_path: Path, make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    artifact = make_artifact()
    artifact["spec"]["storage"] = {"hostPath": {"path": "/home/me/models"}}
    route = make_route(ranges=[(0, 10), (5, 30)])
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    code, output = validate(write(tmp_path / "all.yaml", artifact, route, config))
    assert code == 1
    assert "spec.storage.hostPath: path must be an absolute, normalised host path" in output
    assert "spec.stages: stages must be ordered and contiguous" in output
    assert "skipped  " in output and "ConfigMap/c" in output


def test_a_route_of_the_last_release_with_recipe_mtp_is_valid_with_a_warning_naming_speculation(
        tmp_path: Path, make_route: MakeRoute) -> None:
    old = write(tmp_path / "route.yaml", make_route(recipe={"lane": "cpu", "mtp": "Disabled"}))
    code, output = validate(old)
    assert code == 0, output
    assert "valid    " in output and "warning: spec.recipe.mtp: mtp was removed" in output
    assert "recipe.speculation" in output
    refused = write(tmp_path / "refused.yaml", make_route(recipe={"lane": "cpu", "mtp": "On"}))
    code, output = validate(refused)
    assert code == 1 and "spec.recipe.mtp: mtp was removed" in output
