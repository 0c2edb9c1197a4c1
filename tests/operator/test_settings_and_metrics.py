"""Operator settings from the environment, and the metrics it exports."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meshnet.errors import OperatorError
from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator.queue import KeyedQueue
from meshnet.operator.settings import OperatorSettings


def test_settings_are_read_from_meshnet_environment_variables() -> None:
    settings = OperatorSettings.from_env({
        "MESHNET_NAMESPACES": "ml, serving", "MESHNET_WORKER_IMAGE_CUDA": "w-cuda:2",
        "MESHNET_PIN_DIGEST": "a" * 64, "MESHNET_TRACKER_URL": "https://tracker.example",
        "MESHNET_TRACKER_SECRET": "tracker-token", "MESHNET_METRICS_PORT": "9300",
        "MESHNET_RESYNC_SECONDS": "15", "MESHNET_MAX_CONCURRENT_RECONCILES": "4",
        "MESHNET_COMPRESSION_BREAK_EVEN_MBPS": "57"})
    assert settings.namespaces == ("ml", "serving")
    assert settings.worker_images == {"cuda": "w-cuda:2"}
    assert (settings.tracker_url, settings.tracker_secret) == ("https://tracker.example",
                                                              "tracker-token")
    assert settings.metrics_port == 9300 and settings.resync_seconds == 15.0
    assert settings.max_concurrent_reconciles == 4
    assert settings.worker_config().pin_digest == "a" * 64
    # (SmolLM2's break-even: routes of a narrow model pack only below it)
    assert settings.placement_config().compression_break_even_bits_per_second == 57e6


def test_artifact_copies_are_re_hashed_weekly_unless_the_interval_is_zero() -> None:
    default = OperatorSettings.from_env({"MESHNET_PIN_DIGEST": "a" * 64})
    assert default.provisioner_config("img").rehash_every == timedelta(days=7)
    daily = OperatorSettings.from_env({"MESHNET_PIN_DIGEST": "a" * 64,
                                       "MESHNET_ARTIFACT_REHASH_SECONDS": "86400"})
    assert daily.provisioner_config("img").rehash_every == timedelta(days=1)
    off = OperatorSettings.from_env({"MESHNET_PIN_DIGEST": "a" * 64,
                                     "MESHNET_ARTIFACT_REHASH_SECONDS": "0"})
    assert off.provisioner_config("img").rehash_every is None


def test_the_pin_digest_defaults_to_the_checkouts_llama_pin() -> None:
    from meshnet.paths import repo_root
    from meshnet.pin.manifest import load_manifest
    expected = load_manifest(repo_root() / "llama-pin.yaml").digest()
    assert OperatorSettings.from_env({}).pin_digest == expected


def test_a_malformed_setting_names_its_variable() -> None:
    with pytest.raises(OperatorError, match="MESHNET_METRICS_PORT='http' is not a valid int"):
        OperatorSettings.from_env({"MESHNET_PIN_DIGEST": "a", "MESHNET_METRICS_PORT": "http"})


def test_routes_are_counted_by_condition_and_forgotten_when_deleted() -> None:
    metrics = OperatorMetrics()
    metrics.route_conditions(("ns", "a"), {"Ready": "True", "Degraded": "False"})
    metrics.route_conditions(("ns", "b"), {"Ready": "False", "Degraded": "True"})
    metrics.route_conditions(("ns", "b"), None)
    text = generate_latest(metrics.registry).decode()
    assert 'meshnet_routes{condition="Ready",status="True"} 1.0' in text
    assert 'meshnet_routes{condition="Degraded",status="True"} 0.0' in text
    for name in ("meshnet_reconciles_total", "meshnet_reconcile_errors_total",
                 "meshnet_reconcile_duration_seconds", "meshnet_epoch_advances_total"):
        assert name in text


ROUTE_STATUS = {
    "epoch": 3, "coverage": "0-30/30",
    "conditions": [{"type": "Ready", "status": "True"}, {"type": "Progressing", "status": "False"},
                   {"type": "Certified", "status": "False", "reason": "CertificationFailed"}],
    "stages": [{"name": "head", "ready": True, "restarts": 0},
               {"name": "tail", "ready": False, "restarts": 2}],
}


def samples(metrics: OperatorMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(series name, labels) -> value of everything the registry exports."""
    text = generate_latest(metrics.registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def test_each_route_s_status_becomes_gauges_labelled_by_namespace_route_and_stage() -> None:
    metrics = OperatorMetrics()
    metrics.status.route(("ml", "r"), ROUTE_STATUS)
    found, route = samples(metrics), {"namespace": "ml", "route": "r"}
    condition = "meshnet_route_condition"
    assert value(found, condition, **route, condition="Ready", status="True") == 1
    assert value(found, condition, **route, condition="Ready", status="False") == 0
    assert value(found, condition, **route, condition="Degraded", status="Unknown") == 1
    assert value(found, "meshnet_route_epoch", **route) == 3
    assert value(found, "meshnet_route_stages", **route) == 2
    assert value(found, "meshnet_route_stages_ready", **route) == 1
    assert value(found, "meshnet_route_coverage_ratio", **route) == 1
    assert value(found, "meshnet_route_certification", **route,
                 state="CertificationFailed") == 1
    assert value(found, "meshnet_stage_ready", **route, stage="tail") == 0
    assert value(found, "meshnet_stage_restarts_total", **route, stage="tail") == 2


def test_a_route_s_replicas_asked_and_ready_are_gauges() -> None:
    metrics = OperatorMetrics()
    replicas = [{"replica": r, "ready": r == 0} for r in range(3)]
    metrics.status.route(("ml", "r"), {**ROUTE_STATUS, "replicaStatuses": replicas,
                                       "readyReplicas": 1})
    metrics.status.route(("ml", "idle"), {**ROUTE_STATUS, "replicaStatuses": [],
                                          "readyReplicas": 0})
    found = samples(metrics)
    assert value(found, "meshnet_route_replicas", namespace="ml", route="r") == 3
    assert value(found, "meshnet_route_replicas_ready", namespace="ml", route="r") == 1
    assert value(found, "meshnet_route_replicas", namespace="ml", route="idle") == 0


def test_a_deleted_route_or_artifact_leaves_no_series_behind() -> None:
    metrics = OperatorMetrics()
    metrics.status.route(("ml", "r"), ROUTE_STATUS)
    metrics.status.artifact(("ml", "a"), {"progress": {"bytesTotal": 10}})
    metrics.status.route(("ml", "r"), None)
    metrics.status.artifact(("ml", "a"), None)
    text = generate_latest(metrics.registry).decode()
    assert 'route="r"' not in text and 'artifact="a"' not in text
    assert "# TYPE meshnet_route_epoch gauge" in text  # the families stay declared


def test_an_artifact_s_progress_copies_and_conditions_become_gauges() -> None:
    metrics = OperatorMetrics()
    metrics.status.artifact(("ml", "a"), {
        "progress": {"bytesVerified": 60, "bytesTotal": 100, "filesVerified": 1,
                     "filesTotal": 2},
        "nodes": [{"node": "gpu-1", "verified": True}, {"node": "gpu-2", "verified": False}],
        "conditions": [{"type": "Failed", "status": "True", "reason": "HashMismatch"}]})
    found, artifact = samples(metrics), {"namespace": "ml", "artifact": "a"}
    assert value(found, "meshnet_artifact_verified_bytes", **artifact) == 60
    assert value(found, "meshnet_artifact_size_bytes", **artifact) == 100
    assert value(found, "meshnet_artifact_verified_files", **artifact) == 1
    assert value(found, "meshnet_artifact_files", **artifact) == 2
    assert value(found, "meshnet_artifact_node_copy_verified", **artifact, node="gpu-1") == 1
    assert value(found, "meshnet_artifact_node_copy_verified", **artifact, node="gpu-2") == 0
    assert value(found, "meshnet_artifact_condition", **artifact, condition="Failed",
                 status="True") == 1


async def test_triggers_during_a_reconcile_collapse_into_one_rerun() -> None:
    import asyncio
    queue, runs, gate = KeyedQueue(), [], asyncio.Event()

    async def work() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            await gate.wait()

    first = asyncio.create_task(queue.run("r1", work))
    await asyncio.sleep(0)
    followers = [asyncio.create_task(queue.run("r1", work)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *followers)
    assert runs == [0, 1]  # the first run, then a single rerun for all five triggers


async def test_triggers_while_a_delayed_run_waits_are_served_by_that_run() -> None:
    import asyncio
    queue, runs = KeyedQueue(), []

    async def work() -> None:
        runs.append(len(runs))

    first = asyncio.create_task(queue.run("r1", work, delay=0.05))
    await asyncio.sleep(0)
    followers = [asyncio.create_task(queue.run("r1", work, delay=0.05)) for _ in range(3)]
    await asyncio.gather(first, *followers)
    assert runs == [0]  # all four triggers came before the run started: one run
    await queue.run("r1", work)
    assert runs == [0, 1]  # a later trigger: a run of its own


def test_expectations_hide_the_lag_between_our_writes_and_the_watch() -> None:
    from meshnet.operator.expectations import TTL_SECONDS, Expectations
    from meshnet.reconcile.route import ObservedPod

    now = [0.0]
    expect = Expectations(clock=lambda: now[0])
    labels = {"meshnet.dev/stage": "s0", "meshnet.dev/epoch": "2"}
    expect.created("r", {"metadata": {"name": "r-s0-e2", "labels": labels}})
    expect.deleted("r", "r-s0-e1")
    old = ObservedPod(name="r-s0-e1", stage="s0", epoch=1)
    seen = expect.apply("r", (old,))  # the watch has seen neither write yet
    assert [(p.name, p.terminating) for p in seen] == [("r-s0-e1", True), ("r-s0-e2", False)]
    new = ObservedPod(name="r-s0-e2", stage="s0", epoch=2)
    assert expect.apply("r", (new,)) == (new,)  # both confirmed: nothing is added
    expect.created("r", {"metadata": {"name": "lost", "labels": labels}})
    now[0] = TTL_SECONDS + 1
    assert expect.apply("r", ()) == ()  # never confirmed: forgotten after the TTL


def test_a_drain_we_stamped_is_seen_before_the_watch_shows_it() -> None:
    """Else a reconcile that races the watch drains the pipeline again, restarting its
    drain's clock and posting its event twice."""
    from meshnet.operator.expectations import Expectations
    from meshnet.reconcile.route import ObservedPod

    expect = Expectations()
    expect.draining("r", "r-s0-e1", "2026-12-06T17:00:00Z")
    pod = ObservedPod(name="r-s0-e1", stage="s0", epoch=1)
    assert [p.draining_since for p in expect.apply("r", (pod,))] == ["2026-12-06T17:00:00Z"]
    shown = ObservedPod(name="r-s0-e1", stage="s0", epoch=1, draining_since="2026-12-06T17:00:01Z")
    assert expect.apply("r", (shown,)) == (shown,)  # the watch's stamp wins, ours is dropped
    assert expect.apply("r", (pod,)) == (pod,)  # (and is not brought back)


def test_a_pod_event_is_news_only_when_the_planner_would_see_the_pod_differently() -> None:
    from meshnet.operator.expectations import Expectations

    expect = Expectations()
    labels = {"meshnet.dev/stage": "s0", "meshnet.dev/epoch": "1"}
    created = {"metadata": {"name": "r-s0-e1", "uid": "u1", "labels": labels}}
    expect.created("r", created)
    assert expect.unchanged("r", created)  # the echo of our own create
    assert not expect.unchanged("other-route", created)
    ready = {**created, "status": {"phase": "Running",
                                   "conditions": [{"type": "Ready", "status": "True"}]}}
    assert not expect.unchanged("r", ready)  # the kubelet moved it: the planner must see that
    annotated = {**ready, "metadata": {**ready["metadata"], "annotations": {"a": "b"}}}
    assert expect.unchanged("r", annotated)  # nothing the planner reads changed
    assert expect.unchanged("r", ready)  # a re-opened watch replays it as ADDED
    assert not expect.unchanged("r", {"metadata": {"name": "stranger", "labels": labels}})
    assert not expect.gone("r", "r-s0-e1")  # deleted by someone else: news
    assert not expect.unchanged("r", ready)  # created again under the same name: news


def test_only_the_last_of_the_pods_we_deleted_going_is_news() -> None:
    from meshnet.operator.expectations import Expectations

    expect = Expectations()
    for name in ("r-s0-e1", "r-s1-e1"):
        expect.deleted("r", name)
    assert expect.gone("r", "r-s0-e1")  # r-s1-e1 still going: nothing to plan yet
    assert not expect.gone("r", "r-s1-e1")  # the last one: the new epoch can start
    assert not expect.gone("r", "someone-elses")  # not ours: always news


def test_a_daemon_copies_the_route_and_its_pods_again_only_when_they_changed() -> None:
    from meshnet.operator.tracker_daemon import _Snapshot

    snapshot = _Snapshot()
    live = {"metadata": {"name": "r", "resourceVersion": "7"}, "status": {"epoch": 1}}
    first = snapshot.body(live)
    assert first == live and first is not live
    live["status"]["epoch"] = 2  # what a pass holds does not move under it
    assert first["status"]["epoch"] == 1
    assert snapshot.body(live) is first  # same resourceVersion: the same copy
    live = {**live, "metadata": {"name": "r", "resourceVersion": "8"}}
    assert snapshot.body(live)["status"]["epoch"] == 2
    pod, other = {"name": "r-s0-e1"}, {"name": "r-s1-e1"}
    pods = snapshot.pods([pod, other])
    assert pods == [pod, other] and pods[0] is not pod
    assert snapshot.pods([pod, other]) is pods  # the index holds the same objects
    assert snapshot.pods([pod, {"name": "r-s1-e2"}])[1] == {"name": "r-s1-e2"}
    assert snapshot.pods([pod]) == [pod]


def test_a_quiet_route_is_sampled_once_per_quiet_period_and_any_change_restores_the_rate(
        ) -> None:
    from meshnet.operator.pace import Pace

    pace = Pace(sample_seconds=5.0, quiet_seconds=25.0)
    assert pace.due("v1", 0.0)
    pace.passed("v1", ("idle",), 0.0)
    assert not pace.due("v1", 4.9) and pace.due("v1", 5.0)
    pace.passed("v1", ("idle",), 5.0)  # the same answers: quiet
    assert not pace.due("v1", 29.9) and pace.due("v1", 30.0)
    assert pace.due("v2", 6.0)  # the route, its pods, an artifact or a Job changed
    pace.passed("v2", ("busy",), 6.0)  # new answers: back to every sample period
    assert pace.due("v2", 11.0)
    pace.passed("v2", None, 11.0)  # a failed pass is retried at the full rate
    assert pace.due("v2", 16.0)
