"""The CRDs' CEL rules, evaluated by a CEL library on valid and invalid objects."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from meshnet.api.checks import drafter_problems, route_problems
from meshnet.api.modelartifact import GgufDrafter, ModelArtifactSpec
from meshnet.api.schemacheck import check
from meshnet.api.shardroute import ShardRouteSpec
from meshnet.api.validate import schemas
from meshnet.paths import repo_root

MakeArtifact = MakeRoute = Callable[..., dict[str, Any]]  # fixtures from conftest.py


def problems(body: dict[str, Any]) -> list[str]:
    body = {k: v for k, v in body.items() if k != "status"}
    return [str(p) for p in check(body, schemas()[body["kind"]])]


def test_valid_examples_pass_every_rule(make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    assert problems(make_route()) == []
    assert problems(make_route(ranges=[(0, 30)])) == []
    assert problems(make_artifact()) == []
    assert problems(make_artifact(host_path=True)) == []


@pytest.mark.parametrize(("ranges", "message"), [
    ([(0, 10), (10, 10)], "spec.stages[1].layers: layers.begin must be less than layers.end"),
    ([(0, 10), (12, 30)], "spec.stages: stages must be ordered and contiguous"),
    ([(0, 12), (10, 30)], "spec.stages: stages must be ordered and contiguous"),
    ([(10, 20), (0, 10)], "spec.stages: stages must be ordered and contiguous"),
    ([(5, 10), (10, 30)], "spec.stages: the first stage must begin at layer 0"),
])
def test_stage_ranges_must_be_non_empty_ordered_contiguous_and_start_at_layer_0(
        make_route: MakeRoute, ranges: list[tuple[int, int]], message: str) -> None:
    assert any(p.startswith(message) for p in problems(make_route(ranges=ranges)))


def test_stage_names_must_be_unique(make_route: MakeRoute) -> None:
    route = make_route()
    route["spec"]["stages"][2]["name"] = "s0"
    assert problems(route) == ["spec.stages: stage names must be unique"]


@pytest.mark.parametrize(("lane", "resources", "valid"), [
    ("cuda", {"gpus": 2}, True),
    ("rocm", {"gpus": 1}, True),
    ("vulkan", {"gpus": 1, "gpuResourceName": "example.com/gpu"}, True),
    ("vulkan", {"gpus": 0}, True),
    ("vulkan", {"gpus": 1}, False),
    ("cpu", {"gpus": 1}, False),
])
def test_gpus_on_a_lane_without_a_default_gpu_resource_need_its_name(
        make_route: MakeRoute, lane: str, resources: dict[str, Any], valid: bool) -> None:
    route = make_route(recipe={"lane": lane})
    route["spec"]["stages"][1]["resources"] = resources
    found = problems(route)
    assert found == [] if valid else [p for p in found if "gpuResourceName" in p] == found != []
    spec = ShardRouteSpec.model_validate(route["spec"])
    operator_view = [str(p) for p in route_problems(spec, None)]
    assert operator_view == [] if valid else operator_view == [
        f"spec.stages[1].resources: stage 's1' requests GPUs, but lane {lane!r}"
        " has no default GPU resource: set gpuResourceName"]


@pytest.mark.parametrize("speculation", [
    {}, {"mode": "Disabled"}, {"mode": "Lookup"},
    {"mode": "Lookup", "maxDrafts": 1, "maxWindows": 1},
    {"mode": "Lookup", "maxDrafts": 7, "maxWindows": 8},
])
def test_a_route_speculates_by_prompt_lookup_or_not_at_all(
        make_route: MakeRoute, speculation: dict[str, Any]) -> None:
    route = make_route(recipe={"lane": "cpu", "speculation": speculation})
    assert problems(route) == []
    assert route_problems(ShardRouteSpec.model_validate(route["spec"]), None) == []


def test_a_route_may_draft_with_mtp_on_its_last_stage_whose_layers_the_artifact_decides(
        make_route: MakeRoute) -> None:
    route = make_route(recipe={"lane": "cpu", "speculation": {"mode": "MTP"}})
    assert problems(route) == []
    spec = ShardRouteSpec.model_validate(route["spec"])
    assert route_problems(spec, None) == []
    assert drafter_problems(spec, False, None) == []  # headers not read yet: nothing to say
    (missing,) = drafter_problems(spec, True, None)
    assert (missing.path, missing.reason) == ("spec.recipe.speculation.mode", "DrafterMissing")


def test_a_route_may_draft_with_dspark_on_its_last_stage_if_the_artifact_carries_one(
        make_route: MakeRoute) -> None:
    route = make_route(recipe={"lane": "cpu", "speculation": {"mode": "DSpark"}})
    assert problems(route) == []
    spec = ShardRouteSpec.model_validate(route["spec"])
    assert route_problems(spec, None) == []
    assert drafter_problems(spec, False, None) == []  # headers not read yet: nothing to say
    (missing,) = drafter_problems(spec, True, None)
    assert (missing.path, missing.reason) == ("spec.recipe.speculation.mode", "DrafterMissing")
    mtp = GgufDrafter(kind="MTP", target_layers=[29], vocab_size=49152)
    (other,) = drafter_problems(spec, True, mtp)  # MTP blocks are no DSpark drafter
    assert other.reason == "DrafterMissing" and "carries a MTP drafter" in str(other)


def test_a_split_keeping_layers_the_drafter_reads_off_the_last_stage_is_refused_naming_them(
        make_route: MakeRoute) -> None:
    route = make_route(ranges=[(0, 10), (10, 28), (28, 30)],
                       recipe={"lane": "cpu", "speculation": {"mode": "DSpark"}})
    spec = ShardRouteSpec.model_validate(route["spec"])
    drafter = GgufDrafter(kind="DSpark", target_layers=[27, 28, 29], vocab_size=49152)
    (split,) = drafter_problems(spec, True, drafter)
    assert split.reason == "DrafterLayersSplit"
    assert str(split) == (
        "spec.stages[2].layers: the DSpark drafter reads the outputs of layers 27, 28, 29,"
        " which only the stage computing them has; the last stage 's2' owns 28:30: it must"
        " begin at layer 27 or earlier")
    fits = ShardRouteSpec.model_validate(make_route(
        ranges=[(0, 10), (10, 27), (27, 30)],
        recipe={"lane": "cpu", "speculation": {"mode": "DSpark"}})["spec"])
    assert drafter_problems(fits, True, drafter) == []


@pytest.mark.parametrize(("speculation", "message"), [
    ({"mode": "Eagle"}, "spec.recipe.speculation.mode: 'Eagle' is not one of"
                        " ['Disabled', 'Lookup', 'MTP', 'DSpark']"),
    ({"maxDrafts": 0}, "spec.recipe.speculation.maxDrafts: 0 is less than the minimum of 1"),
    ({"maxDrafts": 8}, "spec.recipe.speculation.maxDrafts: 8 is greater than the maximum of 7"),
    ({"maxWindows": 0}, "spec.recipe.speculation.maxWindows: 0 is less than the minimum of 1"),
    ({"maxWindows": 9}, "spec.recipe.speculation.maxWindows: 9 is greater than the maximum of 8"),
    ({"mtp": "Disabled"}, "spec.recipe.speculation: Additional properties are not allowed"
                          " ('mtp' was unexpected)"),
])
def test_speculation_out_of_range_or_unknown_is_refused(
        make_route: MakeRoute, speculation: dict[str, Any], message: str) -> None:
    route = make_route(recipe={"lane": "cpu", "speculation": {"mode": "Lookup", **speculation}})
    assert problems(route) == [message]


# A ShardRoute of the last release (0.1): examples/shardroute-smollm2-3stage.yaml then.
OLD_MANIFEST = """
apiVersion: meshnet.dev/v1alpha1
kind: ShardRoute
metadata: {name: smollm2-3stage}
spec:
  artifactRef: {name: smollm2-135m-q4-1}
  recipe: {lane: cpu, boundaryDtype: f32, contextLength: 4096, sessionSlots: 4, mtp: Disabled}
  stages:
    - {name: head, layers: {begin: 0, end: 10}}
    - {name: middle, layers: {begin: 10, end: 20}}
    - {name: tail, layers: {begin: 20, end: 30}}
"""


def test_a_manifest_of_the_last_release_with_recipe_mtp_is_accepted_with_a_warning() -> None:
    old = yaml.safe_load(OLD_MANIFEST)
    crd = yaml.safe_load((repo_root() / "crds" / "meshnet.dev_shardroutes.yaml").read_text())
    assert check(old, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]) == []
    spec = ShardRouteSpec.model_validate(old["spec"])
    assert route_problems(spec, 30) == []
    [warning] = spec.recipe.removed_fields()
    assert warning.startswith("spec.recipe.mtp: mtp was removed")
    assert "recipe.speculation" in warning
    assert spec.recipe.identity() == ShardRouteSpec.model_validate(
        {**old["spec"], "recipe": {k: v for k, v in old["spec"]["recipe"].items()
                                   if k != "mtp"}}).recipe.identity()  # the same recipeDigest


@pytest.mark.parametrize(("recipe", "message"), [
    ({"mtp": "Enabled"}, "only its one value, Disabled, is still accepted"),
    ({"mtp": "Disabled", "speculation": {"mode": "MTP"}},
     "mtp: Disabled contradicts speculation.mode MTP: remove mtp"),
])
def test_recipe_mtp_with_a_meaning_speculation_does_not_keep_is_refused_naming_it(
        make_route: MakeRoute, recipe: dict[str, Any], message: str) -> None:
    route = make_route(recipe={"lane": "cpu", **recipe})
    [problem] = problems(route)
    assert problem.startswith("spec.recipe.mtp: mtp was removed: multi-token prediction is"
                              " recipe.speculation") and message in problem
    [checked] = route_problems(ShardRouteSpec.model_validate(route["spec"]), None)
    assert (checked.path, checked.reason) == ("spec.recipe.mtp", "RemovedField")


def test_a_prefix_block_wider_than_a_step_is_refused_with_its_reason(
        make_route: MakeRoute) -> None:
    route = make_route(recipe={"lane": "cpu", "prefixCache": {"entries": 4, "block": 1024}})
    assert problems(route) == ["spec.recipe.prefixCache.block: block must be at most 512, the"
                               " tokens a stage takes in one step: a block is prefilled as"
                               " one step"]
    [checked] = route_problems(ShardRouteSpec.model_validate(route["spec"]), 30)
    assert (checked.path, checked.reason) == ("spec.recipe.prefixCache.block",
                                              "PrefixBlockTooLarge")
    assert "every prompt over 512 tokens would be refused" in checked.message
    widest = make_route(recipe={"lane": "cpu", "prefixCache": {"entries": 4, "block": 512}})
    assert problems(widest) == []
    assert route_problems(ShardRouteSpec.model_validate(widest["spec"]), 30) == []


@pytest.mark.parametrize("topology", ["hub", "chain", "ring"])
def test_a_route_runs_its_stages_as_a_hub_a_chain_or_a_ring(
        make_route: MakeRoute, topology: str) -> None:
    assert problems(make_route(recipe={"lane": "cpu", "topology": topology})) == []


def test_any_other_topology_is_refused_naming_the_three(make_route: MakeRoute) -> None:
    route = make_route(recipe={"lane": "cpu", "topology": "mesh"})
    assert problems(route) == ["spec.recipe.topology: 'mesh' is not one of"
                               " ['hub', 'chain', 'ring']"]


@pytest.mark.parametrize("path", ["/home/models", "/home", "/var/../home/x", "relative/dir",
                                  "/data//models"])
def test_host_paths_must_be_absolute_normalised_and_outside_home(
        make_artifact: MakeArtifact, path: str) -> None:
    artifact = make_artifact(host_path=True)
    artifact["spec"]["storage"]["hostPath"]["path"] = path
    found = problems(artifact)
    assert len(found) == 1 and found[0].startswith("spec.storage.hostPath: path must be an")
    source = copy.deepcopy(make_artifact())
    source["spec"]["source"] = {"hostPath": {"path": path}}
    assert problems(source)[0].startswith("spec.source.hostPath: path must be an absolute")


def test_sha256_must_be_64_lower_case_hex_digits(make_artifact: MakeArtifact) -> None:
    artifact = make_artifact()
    artifact["spec"]["files"][0]["sha256"] = "A" * 64
    assert problems(artifact) == ["spec.files[0].sha256: sha256 must be 64 lower-case hex digits"]


@pytest.mark.parametrize("name", ["dir/model.gguf", "..", "a\\b.gguf"])
def test_file_names_must_not_contain_path_separators(make_artifact: MakeArtifact,
                                                     name: str) -> None:
    artifact = make_artifact()
    artifact["spec"]["files"][0]["name"] = name
    assert problems(artifact) == [
        "spec.files[0].name: file names must not contain path separators"]


def test_an_artifact_has_a_model_file_and_at_most_one_drafter(
        make_artifact: MakeArtifact) -> None:
    artifact = make_artifact()
    files = artifact["spec"]["files"]
    drafter = dict(files[0], name="drafter.gguf", role="Drafter")
    artifact["spec"]["files"] = [*files, drafter]
    assert problems(artifact) == []
    artifact["spec"]["files"] = [*files, drafter, dict(drafter, name="other.gguf")]
    assert problems(artifact) == ["spec.files: at most one file has role Drafter"]
    artifact["spec"]["files"] = [drafter]
    assert problems(artifact) == ["spec.files: at least one file has role Model"]
    with pytest.raises(ValueError, match="at least one file of role Model"):
        ModelArtifactSpec.model_validate(artifact["spec"])
    files[0]["role"] = "Draft"
    assert problems(make_artifact() | {"spec": artifact["spec"] | {"files": files}})[0] \
        .startswith("spec.files[0].role: 'Draft' is not one of")


def test_exactly_one_source_and_one_storage_must_be_given(make_artifact: MakeArtifact) -> None:
    artifact = make_artifact()
    artifact["spec"]["source"]["pvc"] = {"claimName": "other"}
    del artifact["spec"]["storage"]["pvc"]
    assert problems(artifact) == [
        "spec.source: exactly one of http, pvc, hostPath must be set",
        "spec.storage: exactly one of pvc, hostPath must be set"]


def test_unknown_fields_and_wrong_types_are_reported_with_their_path(
        make_route: MakeRoute) -> None:
    route = make_route()
    route["spec"]["stages"][0]["gpu"] = 1
    route["spec"]["recipe"]["sessionSlots"] = "four"
    found = problems(route)
    assert "spec.recipe.sessionSlots: 'four' is not of type 'integer'" in found
    assert any(p.startswith("spec.stages[0]: Additional properties") for p in found)


@pytest.mark.parametrize(("rollout", "valid"), [
    ({}, True),
    ({"maxSurge": 0}, True),
    ({"maxUnavailable": 0}, True),
    ({"maxSurge": 0, "maxUnavailable": 0}, False),
])
def test_a_rollout_needs_surge_or_unavailability_to_replace_a_replica(
        make_route: MakeRoute, rollout: dict[str, int], valid: bool) -> None:
    found = problems(make_route(rollout=rollout))
    assert found == ([] if valid else [
        "spec.rollout: maxSurge and maxUnavailable cannot both be 0: no replica could be"
        " replaced"])
