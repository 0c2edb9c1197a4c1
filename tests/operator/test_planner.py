"""The pure planner: epochs, children, conditions and events from observed state alone."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from meshnet.api.modelartifact import ModelArtifactSpec
from meshnet.api.shardroute import DEFAULT_PREFIX_BLOCKS
from meshnet.reconcile.plan import Create, Delete, Patch, Plan
from meshnet.reconcile.route import (
    Observed,
    ObservedPod,
    WorkerConfig,
    observe_pod,
    observe_referenced_artifact,
    observe_route,
    plan,
)
from meshnet.reconcile.route.networkpolicy import PolicyConfig
from meshnet.route.handshake import STEP_SENSITIVE_ARCHITECTURES

# (the NetworkPolicy has its own tests: test_network_policy.py)
CONFIG = WorkerConfig(images={"cpu": "meshnet/worker-cpu:1", "cuda": "w-cuda:1"},
                      pin_digest="p" * 64, network_policy=PolicyConfig(enabled=False))
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
NOW_TEXT = "2026-11-29T12:00:00Z"
MakeArtifact = MakeRoute = Callable[..., dict[str, Any]]  # fixtures from conftest.py


def kubelet(pods: dict[str, dict[str, Any]], result: Plan, *, ready: bool = True,
            waiting: str | None = None) -> None:
    """Carry out a plan's pod actions the way the cluster would, marking new pods ready."""
    for action in result.actions:
        if isinstance(action, Delete) and action.kind == "Pod":
            pods.pop(action.name)
        elif isinstance(action, Patch) and action.kind == "Pod":
            meta = pods[action.name]["metadata"]
            meta["annotations"] = {**meta.get("annotations", {}),
                                   **action.body["metadata"]["annotations"]}
        elif isinstance(action, Create) and action.obj["kind"] == "Pod":
            body = copy.deepcopy(action.obj)
            body["metadata"]["uid"] = "pod-" + body["metadata"]["name"]
            state = {"waiting": {"reason": waiting, "message": "back-off 5m"}} if waiting else {}
            last = {"terminated": {"exitCode": 139, "reason": "Error"}} if waiting else {}
            body["status"] = {"phase": "Running",
                              "conditions": [{"type": "Ready", "status": str(ready)}],
                              "containerStatuses": [{"restartCount": 3 if waiting else 0,
                                                     "state": state, "lastState": last}]}
            pods[body["metadata"]["name"]] = body


def observe(route: dict[str, Any], artifact: dict[str, Any] | None,
            pods: dict[str, dict[str, Any]], service: bool = True) -> Observed:
    observed = [p for p in map(observe_pod, pods.values()) if p is not None]
    return Observed(observe_route(route), tuple(observed),
                    services={0: _service_hash(route)} if service else {},
                    artifact=observe_referenced_artifact(artifact) if artifact else None)


def _service_hash(route: dict[str, Any]) -> str:
    from meshnet.reconcile.route import headless_service
    from meshnet.reconcile.route.podspec import RouteRef
    meta = route["metadata"]
    svc = headless_service(RouteRef(meta["name"], meta["namespace"], meta["uid"]), CONFIG)
    return str(svc["metadata"]["labels"]["meshnet.dev/template-hash"])


def converge(route: dict[str, Any], artifact: dict[str, Any],
             pods: dict[str, dict[str, Any]], **kubelet_args: Any) -> list[Plan]:
    """Plan, apply, repeat until a plan has nothing to do; returns every plan."""
    plans = []
    for _ in range(10):
        result = plan(observe(route, artifact, pods), CONFIG, NOW)
        plans.append(result)
        kubelet(pods, result, **kubelet_args)
        if result.status is not None:
            route["status"] = result.status
        if not result.actions and result.status is None:
            return plans
    raise AssertionError("the planner did not converge")


def condition(route: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in route["status"]["conditions"] if c["type"] == kind)


def reasons(plans: list[Plan]) -> list[str]:
    return [e.reason for p in plans for e in p.events]


def test_a_new_route_gets_one_pod_per_stage_a_headless_service_and_epoch_one(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route = make_route()
    first = plan(observe(route, make_artifact(), {}, service=False), CONFIG, NOW)
    kinds = sorted(a.obj["kind"] for a in first.actions if isinstance(a, Create))
    assert kinds == ["Pod", "Pod", "Pod", "Service"]
    assert first.epoch_advanced and first.status is not None and first.status["epoch"] == 1
    names = [a.obj["metadata"]["name"] for a in first.actions if isinstance(a, Create)]
    assert names == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1", "r1-workers"]
    assert [e.reason for e in first.events] == ["EpochAdvanced", "StagePodCreated"]
    assert first.events[1].message == (  # one event per reconcile, not one per pod
        "created pods r1-s0-e1 for stage s0 (layers 0:10), r1-s1-e1 for stage s1 (layers"
        " 10:20), r1-s2-e1 for stage s2 (layers 20:30), epoch 1")


def test_a_converged_route_is_ready_with_endpoints_coverage_and_capacity(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, pods = make_route(), {}
    converge(route, make_artifact(), pods)
    status = route["status"]
    assert condition(route, "Ready")["status"] == "True"
    assert condition(route, "Progressing")["reason"] == "RolloutComplete"
    assert condition(route, "Degraded")["status"] == "False"
    assert status["stagesReady"] == "3/3" and status["coverage"] == "0-30/30"
    assert status["capacity"] == {"readyStages": 3, "totalStages": 3, "sessionSlots": 4}
    assert status["stages"][1]["endpoint"] == "s1-e1.r1-workers.default.svc:50051"
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])


def test_the_epoch_advances_only_when_the_route_digest_changes(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    again = plan(observe(route, artifact, pods), CONFIG, NOW)
    assert again == Plan(conditions=again.conditions,  # nothing to do, status unchanged
                         own_conditions=again.own_conditions)
    assert route["status"]["epoch"] == 1


def test_labels_annotations_and_status_changes_never_advance_the_epoch(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    route["metadata"]["labels"] = {"team": "inference"}
    route["metadata"]["annotations"] = {"note": "hello"}
    route["status"]["stagesReady"] = "0/3"  # someone scribbled on the status
    plans = converge(route, artifact, pods)
    assert route["status"]["epoch"] == 1
    assert "EpochAdvanced" not in reasons(plans)
    assert route["status"]["stagesReady"] == "3/3"  # rebuilt from the pods


def test_a_stage_range_change_advances_the_epoch_and_replaces_every_pod_without_mixing(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(rollout={"drainSeconds": 0}), make_artifact(), {}
    converge(route, artifact, pods)
    route["spec"]["stages"][0]["layers"]["end"] = 12
    route["spec"]["stages"][1]["layers"]["begin"] = 12
    first = plan(observe(route, artifact, pods), CONFIG, NOW)
    assert all(isinstance(a, Create) for a in first.actions)  # beside the old epoch
    assert first.status is not None and first.status["epoch"] == 2
    plans = converge(route, artifact, pods)
    assert sorted(pods) == ["r1-s0-e2", "r1-s1-e2", "r1-s2-e2"]
    assert [e.message for p in plans for e in p.events if e.reason == "StagePodReplaced"] == [
        "deleted pipeline e1/r0 (pods r1-s0-e1, r1-s1-e1, r1-s2-e1): epoch 2 of replica 0 is"
        " ready"]
    assert reasons(plans).count("EpochAdvanced") == 1
    assert route["status"]["epoch"] == 2


def test_a_recipe_change_advances_the_epoch_but_an_image_override_only_replaces_pods(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    route["spec"]["recipe"]["image"] = "registry.local/worker:patched"
    plans = converge(route, artifact, pods)
    assert route["status"]["epoch"] == 1 and "EpochAdvanced" not in reasons(plans)
    assert reasons(plans).count("StagePodReplaced") == 1  # naming the three pods
    assert all(p["spec"]["containers"][0]["image"] == "registry.local/worker:patched"
               for p in pods.values())
    route["spec"]["recipe"]["boundaryDtype"] = "f16"
    converge(route, artifact, pods)
    assert route["status"]["epoch"] == 2


def links(result: Plan) -> dict[str, dict[str, str]]:
    """Per created stage pod: its --next-stage and --ring-last, where it has them."""
    found = {}
    for action in result.actions:
        if isinstance(action, Create) and action.obj["kind"] == "Pod":
            args = action.obj["spec"]["containers"][0]["args"]
            flags = dict(zip(args[::2], args[1::2], strict=True))
            found[action.obj["metadata"]["labels"]["meshnet.dev/stage"]] = {
                k: v for k, v in flags.items() if k in ("--next-stage", "--ring-last")}
    return found


S1, S2 = "s1-e1.r1-workers.default.svc:50051", "s2-e1.r1-workers.default.svc:50051"


@pytest.mark.parametrize(("topology", "expected"), [
    ("hub", {"s0": {}, "s1": {}, "s2": {}}),
    ("chain", {"s0": {"--next-stage": S1}, "s1": {"--next-stage": S2}, "s2": {}}),
    ("ring", {"s0": {"--next-stage": S1, "--ring-last": S2}, "s1": {"--next-stage": S2},
              "s2": {}}),
])
def test_chain_and_ring_stages_name_their_neighbours_by_the_stable_stage_addresses(
        make_route: MakeRoute, make_artifact: MakeArtifact, topology: str,
        expected: dict[str, dict[str, str]]) -> None:
    route = make_route(recipe={"lane": "cpu", "topology": topology})
    first = plan(observe(route, make_artifact(), {}), CONFIG, NOW)
    assert links(first) == expected


def test_a_ring_of_one_stage_is_a_plain_stage(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route = make_route(ranges=[(0, 30)], recipe={"lane": "cpu", "topology": "ring"})
    assert links(plan(observe(route, make_artifact(), {}), CONFIG, NOW)) == {"s0": {}}


def test_a_topology_change_replaces_the_pods_it_relinks_at_the_same_epoch(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    """Every topology gives the same tokens: no new routeDigest, but new pods for the
    stages whose links change (the last stage links to nothing and keeps its KV)."""
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    digest, last = route["status"]["routeDigest"], pods["r1-s2-e1"]
    route["spec"]["recipe"]["topology"] = "ring"
    plans = converge(route, artifact, pods)
    assert [e.message for p in plans for e in p.events if e.reason == "StagePodReplaced"] == [
        "deleted pods r1-s0-e1, r1-s1-e1: its pod template changed"]
    assert (route["status"]["epoch"], route["status"]["routeDigest"]) == (1, digest)
    assert pods["r1-s2-e1"] is last  # never deleted nor created again
    head = pods["r1-s0-e1"]["spec"]["containers"][0]["args"]
    assert head[head.index("--ring-last") + 1] == route["status"]["stages"][2]["endpoint"]
    assert condition(route, "Ready")["status"] == "True"


def test_a_speculation_change_replaces_the_pods_whose_flags_change_at_the_same_epoch(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    """Speculation gives the same tokens: no new routeDigest. Turning it on gives the first
    stage its loop bounds and every stage its rollback depth (new pods, same epoch); the
    bounds of a disabled mode change no pod."""
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    digest = route["status"]["routeDigest"]

    def replaced(speculation: dict[str, Any]) -> list[str]:
        route["spec"]["recipe"]["speculation"] = speculation
        plans = converge(route, artifact, pods)
        assert (route["status"]["epoch"], route["status"]["routeDigest"]) == (1, digest)
        assert "EpochAdvanced" not in reasons(plans)
        assert condition(route, "Ready")["status"] == "True"
        return [e.message for p in plans for e in p.events if e.reason == "StagePodReplaced"]

    assert replaced({"maxDrafts": 6, "maxWindows": 3}) == []  # still Disabled
    assert replaced({"mode": "Lookup", "maxDrafts": 6, "maxWindows": 3}) == [
        "deleted pods r1-s0-e1, r1-s1-e1, r1-s2-e1: its pod template changed"]
    head = pods["r1-s0-e1"]["spec"]["containers"][0]["args"]
    at = head.index("--max-loop-drafts")
    assert head[at:at + 6] == [
        "--max-loop-drafts", "6", "--max-loop-windows", "3", "--discard-depth", "20"]
    assert replaced({"mode": "Lookup", "maxDrafts": 6, "maxWindows": 3}) == []


def prefix_flags(pod: dict[str, Any]) -> list[str]:
    args = pod["spec"]["containers"][0]["args"]
    if "--prefix-cache-entries" not in args:
        return []
    at = args.index("--prefix-cache-entries")
    return list(args[at:at + 4])


def test_a_prefix_cache_gives_every_stage_its_flags_at_the_same_epoch(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    """A prefix hit gives a cold run's tokens: no new routeDigest, new pods whose every
    stage keeps entries and reuses in the recipe's block; on by default on the CPU lane,
    `entries: 0` turns it off."""
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    digest = route["status"]["routeDigest"]
    assert prefix_flags(pods["r1-s0-e1"]) == [
        "--prefix-cache-entries", "4", "--prefix-block", "128"]  # llama's default block
    route["spec"]["recipe"]["prefixCache"] = {"entries": 3, "block": 64}
    converge(route, artifact, pods)
    assert (route["status"]["epoch"], route["status"]["routeDigest"]) == (1, digest)
    for name in ("r1-s0-e1", "r1-s1-e1", "r1-s2-e1"):
        assert prefix_flags(pods[name]) == ["--prefix-cache-entries", "3", "--prefix-block", "64"]
    route["spec"]["recipe"]["prefixCache"] = {"entries": 0}
    converge(route, artifact, pods)
    assert (route["status"]["epoch"], route["status"]["routeDigest"]) == (1, digest)
    assert [prefix_flags(pods[n]) for n in ("r1-s0-e1", "r1-s1-e1", "r1-s2-e1")] == [[]] * 3


def test_the_default_prefix_block_is_the_architectures_and_other_lanes_default_to_off(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    # deepseek4 without the cache prefills in steps of 512 from position 0: the same grid
    ds4 = make_artifact(block_count=30)
    ds4["status"]["gguf"]["architecture"] = "deepseek4"
    route, pods = make_route(), {}
    converge(route, ds4, pods)
    assert prefix_flags(pods["r1-s0-e1"]) == [
        "--prefix-cache-entries", "4", "--prefix-block", "512"]
    cuda, pods = make_route(recipe={"lane": "cuda"}), {}
    converge(cuda, make_artifact(), pods)
    assert prefix_flags(pods["r1-s0-e1"]) == []
    assert DEFAULT_PREFIX_BLOCKS.keys() == STEP_SENSITIVE_ARCHITECTURES


def test_a_route_waits_for_its_artifact_to_be_ready(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route = make_route()
    result = plan(observe(route, make_artifact(ready=False), {}, service=False), CONFIG, NOW)
    assert result.actions == ()
    assert result.status is not None
    progressing = next(c for c in result.status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "ArtifactNotReady")
    assert "ModelArtifact smollm2" in progressing["message"]
    missing = plan(observe(route, None, {}, service=False), CONFIG, NOW)
    assert missing.actions == () and missing.conditions["Ready"] == "False"


def test_an_artifact_whose_changed_spec_fails_leaves_the_running_epoch_serving_as_it_was(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    """A wrong sha256 in the ModelArtifact: its pull fails, leaving the files in place, so
    the pods keep serving and status keeps showing them; the undo changes no pod."""
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    serving, stages = dict(pods), route["status"]["stages"]
    good = copy.deepcopy(artifact)
    artifact["spec"]["files"][0]["sha256"] = "e" * 64
    artifact["status"]["conditions"] = [{"type": "Ready", "status": "False",
                                         "reason": "HashMismatch",
                                         "message": "model-00001-of-00002.gguf: sha256 is "
                                                    f"{'f' * 64}, the manifest says {'e' * 64}"}]

    plans = converge(route, artifact, pods)
    assert pods == serving  # nothing deleted, nothing created
    progressing = condition(route, "Progressing")
    assert progressing["reason"] == "ArtifactNotReady"
    assert "to be Ready: HashMismatch: model-00001-of-00002.gguf" in progressing["message"]
    assert "the pods of epoch 1 keep serving meanwhile" in progressing["message"]
    status = route["status"]
    assert (status["epoch"], status["stages"], status["stagesReady"]) == (1, stages, "3/3")
    assert not any(p.actions for p in plans)

    plans = converge(route, good, pods)
    assert pods == serving and route["status"]["epoch"] == 1
    assert condition(route, "Ready")["status"] == "True"


def test_stages_beyond_the_block_count_make_the_route_degraded_with_no_pods(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route = make_route(ranges=[(0, 20), (20, 40)])
    result = plan(observe(route, make_artifact(block_count=30), {}, service=False), CONFIG, NOW)
    assert not any(isinstance(a, Create) for a in result.actions)
    assert result.status is not None
    degraded = next(c for c in result.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "stage 's1' ends at layer 40 but the artifact has only 30 blocks" in degraded["message"]
    assert [e.reason for e in result.events] == ["InvalidSpec"]
    route["status"] = result.status
    again = plan(observe(route, make_artifact(block_count=30), {}, service=False), CONFIG, NOW)
    assert again.events == () and again.status is None  # reported once, not every resync


@pytest.mark.parametrize(("ranges", "missing"), [
    ([(0, 10), (10, 29)], "stage 's1' ends at layer 29 but the artifact has 30 blocks:"
                          " layer 29 would never run"),
    ([(0, 20)], "stage 's0' ends at layer 20 but the artifact has 30 blocks:"
                " layers [20, 30) would never run"),
    ([(2, 15), (15, 30)], "stage 's0' begins at layer 2: layers [0, 2) would never run"),
])
def test_a_route_that_leaves_layers_unserved_is_degraded_naming_them(
        make_route: MakeRoute, make_artifact: MakeArtifact, ranges: list[tuple[int, int]],
        missing: str) -> None:
    route = make_route(ranges=ranges)
    result = plan(observe(route, make_artifact(block_count=30), {}, service=False), CONFIG, NOW)
    assert not any(isinstance(a, Create) for a in result.actions)
    assert result.status is not None
    degraded = next(c for c in result.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert missing in degraded["message"]


def test_a_model_with_mtp_blocks_is_covered_by_its_main_layers(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    # 30 main layers + 1 MTP block: the headers' `layers`, not blockCount, is what stages cover.
    artifact = make_artifact(block_count=31)
    artifact["status"]["gguf"]["layers"] = 30
    route, pods = make_route(), {}
    converge(route, artifact, pods)
    assert condition(route, "Ready")["status"] == "True"
    assert route["status"]["coverage"] == "0-30/30"
    short = make_route(ranges=[(0, 10), (10, 29)])
    result = plan(observe(short, artifact, {}, service=False), CONFIG, NOW)
    assert result.conditions["Degraded"] == "True"


def test_a_spec_that_turns_invalid_keeps_the_last_valid_epochs_pods_and_says_why(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    serving, stages = dict(pods), route["status"]["stages"]
    route["spec"]["recipe"]["speculation"] = {"mode": "MTP"}
    plans = converge(route, artifact, pods)
    assert pods == serving  # nothing deleted, nothing created
    degraded = condition(route, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "DrafterMissing")
    assert ("mode MTP drafts with MTP blocks in its GGUF; the artifact carries no drafter"
            in degraded["message"])
    assert "the pods of epoch 1 keep serving until the spec is fixed" in degraded["message"]
    assert (condition(route, "Ready")["status"], condition(route, "Ready")["reason"]) == (
        "False", "DrafterMissing")
    assert [e.reason for p in plans for e in p.events] == ["DrafterMissing"]  # once
    status = route["status"]
    assert (status["epoch"], status["stages"], status["stagesReady"]) == (1, stages, "3/3")
    assert status["capacity"]["sessionSlots"] == 0  # not Ready
    del route["spec"]["recipe"]["speculation"]
    plans = converge(route, artifact, pods)
    assert pods == serving and reasons(plans) == []  # the same digest: the same pods
    assert condition(route, "Ready")["status"] == "True"


def test_an_invalid_layout_keeps_the_old_one_running_and_the_fixed_one_rolls_to_epoch_two(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact = make_route(rollout={"drainSeconds": 0}), make_artifact(block_count=30)
    pods: dict[str, dict[str, Any]] = {}
    converge(route, artifact, pods)
    route["spec"]["stages"][2]["layers"]["end"] = 29  # layer 29 would never run
    converge(route, artifact, pods)
    assert sorted(pods) == ["r1-s0-e1", "r1-s1-e1", "r1-s2-e1"]
    status = route["status"]
    assert [s["layers"] for s in status["stages"]] == [  # what runs, not the invalid edit
        {"begin": 0, "end": 10}, {"begin": 10, "end": 20}, {"begin": 20, "end": 30}]
    assert status["coverage"] == "0-30/30" and status["observedGeneration"] == 1
    assert "layer 29 would never run" in condition(route, "Degraded")["message"]
    route["spec"]["stages"] = make_route(ranges=[(0, 15), (15, 30)])["spec"]["stages"]
    plans = converge(route, artifact, pods)
    assert sorted(pods) == ["r1-s0-e2", "r1-s1-e2"]
    assert reasons(plans).count("EpochAdvanced") == 1
    assert condition(route, "Ready")["status"] == "True"
    assert condition(route, "Degraded")["reason"] == "AsExpected"


def test_a_spec_invalid_from_the_start_reports_no_stages(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route = make_route(ranges=[(0, 10), (10, 29)])
    result = plan(observe(route, make_artifact(), {}, service=False), CONFIG, NOW)
    assert result.actions == () and result.status is not None
    assert "stages" not in result.status and "keep serving" not in result.events[0].message


def test_a_crash_looping_stage_makes_the_route_degraded_naming_the_stage(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, pods = make_route(), {}
    converge(route, make_artifact(), pods, ready=False, waiting="CrashLoopBackOff")
    degraded = condition(route, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "StageCrashLooping")
    assert "stage s0 (pod r1-s0-e1) is CrashLoopBackOff" in degraded["message"]
    # how it died and where its logs are; the pod is kept so that `--previous` works
    assert ("last exit code 139 (Error); its logs: kubectl logs -n default r1-s0-e1 --previous"
            in degraded["message"])
    assert condition(route, "Ready")["status"] == "False"
    assert route["status"]["stages"][0]["restarts"] == 3
    before = dict(pods)
    converge(route, make_artifact(), pods, ready=False, waiting="CrashLoopBackOff")
    assert pods.keys() == before.keys()


def test_a_deleted_route_deletes_its_pods_and_service(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    route["metadata"]["deletionTimestamp"] = NOW_TEXT
    result = plan(observe(route, artifact, pods), CONFIG, NOW)
    assert sorted((a.kind, a.name) for a in result.actions if isinstance(a, Delete)) == [
        ("Pod", "r1-s0-e1"), ("Pod", "r1-s1-e1"), ("Pod", "r1-s2-e1"), ("Service", "r1-workers")]


def test_a_lost_status_adopts_pods_already_running_the_same_digest(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    del route["status"]
    result = plan(observe(route, artifact, pods), CONFIG, NOW)
    assert not result.epoch_advanced and result.actions == ()
    assert result.status is not None and result.status["epoch"] == 1


def test_condition_transition_times_move_only_when_the_status_flips(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    before = condition(route, "Ready")["lastTransitionTime"]
    later = plan(observe(route, artifact, pods), CONFIG, datetime(2026, 12, 1, tzinfo=UTC))
    assert later.status is None and condition(route, "Ready")["lastTransitionTime"] == before


def test_pods_that_are_not_ours_are_ignored() -> None:
    assert observe_pod({"metadata": {"name": "x", "labels": {"app": "other"}}}) is None
    pod = observe_pod({"metadata": {"name": "x", "labels": {"meshnet.dev/stage": "s0",
                                                             "meshnet.dev/epoch": "2"}}})
    assert pod == ObservedPod(name="x", stage="s0", epoch=2)


def test_conditions_written_by_others_are_kept(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(), make_artifact(), {}
    converge(route, artifact, pods)
    certified = {"type": "Certified", "status": "True", "reason": "ParityPassed",
                 "message": "lane cpu certified", "lastTransitionTime": NOW_TEXT}
    route["status"]["conditions"].append(certified)
    route["spec"]["recipe"]["image"] = "other:1"  # something that rewrites the status
    converge(route, artifact, pods)
    assert condition(route, "Certified") == certified


def with_drafter(artifact: dict[str, Any], kind: str, layers: list[int]) -> dict[str, Any]:
    """The artifact with a drafter reading `layers` (a DSpark GGUF of role Drafter, or the
    model's MTP blocks), as its status reports it."""
    drafter = {"kind": kind, "targetLayers": layers, "vocabSize": 49152}
    if kind == "DSpark":
        artifact["spec"]["files"].append({"name": "drafter.gguf", "size": 10,
                                          "sha256": "d" * 64, "role": "Drafter"})
        artifact["status"]["manifestDigest"] = ModelArtifactSpec.model_validate(
            artifact["spec"]).manifest_digest()
        drafter["file"] = "drafter.gguf"
    artifact["status"]["gguf"]["drafter"] = drafter
    return artifact


def test_a_drafter_runs_on_the_last_stage_only(make_route: MakeRoute,
                                               make_artifact: MakeArtifact) -> None:
    artifact = with_drafter(make_artifact(), "MTP", [29])
    route, pods = make_route(recipe={"lane": "cpu", "speculation": {"mode": "MTP",
                                                                    "maxDrafts": 4}}), {}
    converge(route, artifact, pods)
    assert condition(route, "Ready")["status"] == "True"
    args = {p["metadata"]["labels"]["meshnet.dev/stage"]: p["spec"]["containers"][0]["args"]
            for p in pods.values()}
    assert "--drafter" not in args["s0"] and "--drafter" not in args["s1"]
    assert args["s2"][args["s2"].index("--drafter"):][:4] == ["--drafter", "mtp",
                                                              "--drafter-k", "4"]
    assert "--drafter-model" not in args["s2"]  # the MTP blocks are in the model's GGUF


def test_a_route_drafting_with_what_the_artifact_lacks_is_refused_naming_it(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    artifact = with_drafter(make_artifact(), "DSpark", [27, 28, 29])
    mtp = make_route(recipe={"lane": "cpu", "speculation": {"mode": "MTP"}})
    result = plan(observe(mtp, artifact, {}, service=False), CONFIG, NOW)
    assert not result.actions and result.conditions["Degraded"] == "True"
    assert [e.reason for e in result.events] == ["DrafterMissing"]
    assert ("mode MTP drafts with MTP blocks in its GGUF; the artifact carries a DSpark"
            " drafter") in result.events[0].message
    # the model file every stage would open is the model's, never the drafter
    assert observe_referenced_artifact(artifact).model_file == "model-00001-of-00002.gguf"


def test_a_prefix_block_wider_than_a_step_is_degraded_with_its_reason_and_starts_no_pod(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    # Stages step at most 512 tokens: with 1024-token blocks every longer prompt was a 503.
    route = make_route(recipe={"lane": "cpu", "prefixCache": {"entries": 4, "block": 1024}})
    result = plan(observe(route, make_artifact(), {}, service=False), CONFIG, NOW)
    assert not any(isinstance(a, Create) for a in result.actions)
    assert result.status is not None
    degraded = next(c for c in result.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PrefixBlockTooLarge")
    assert degraded["message"].startswith("spec.recipe.prefixCache.block: block 1024 is more"
                                          " than the 512 tokens a stage takes in one step")
    assert [e.reason for e in result.events] == ["PrefixBlockTooLarge"]


def test_a_route_of_the_last_release_with_recipe_mtp_serves_and_warns_once_per_change(
        make_route: MakeRoute, make_artifact: MakeArtifact) -> None:
    route, artifact, pods = make_route(recipe={"lane": "cpu", "mtp": "Disabled"}), \
        make_artifact(), {}
    plans = converge(route, artifact, pods)
    assert condition(route, "Ready")["status"] == "True"
    [warning] = [e for p in plans for e in p.events if e.reason == "RemovedField"]
    assert warning.type == "Warning" and "recipe.speculation" in warning.message
    without = make_route(recipe={"lane": "cpu"})
    converge(without, artifact, {})
    assert route["status"]["recipeDigest"] == without["status"]["recipeDigest"]
    route["metadata"]["generation"] = 2
    route["spec"]["recipe"]["mtp"] = "Enabled"
    refused = converge(route, artifact, pods)
    degraded = condition(route, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "RemovedField")
    assert "recipe.speculation" in degraded["message"]
    assert "RemovedField" in reasons(refused)
