"""Operator settings from the environment, and the metrics it exports."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from meshnet.errors import OperatorError
from meshnet.operator.metrics import OperatorMetrics
from meshnet.operator.queue import KeyedQueue
from meshnet.operator.settings import OperatorSettings


def test_settings_are_read_from_meshnet_environment_variables() -> None:
    settings = OperatorSettings.from_env({
        "MESHNET_NAMESPACES": "ml, serving", "MESHNET_WORKER_IMAGE_CUDA": "w-cuda:2",
        "MESHNET_PIN_DIGEST": "a" * 64, "MESHNET_TRACKER_URL": "https://tracker.example",
        "MESHNET_TRACKER_SECRET": "tracker-token", "MESHNET_METRICS_PORT": "9300",
        "MESHNET_RESYNC_SECONDS": "15", "MESHNET_MAX_CONCURRENT_RECONCILES": "4"})
    assert settings.namespaces == ("ml", "serving")
    assert settings.worker_images == {"cuda": "w-cuda:2"}
    assert (settings.tracker_url, settings.tracker_secret) == ("https://tracker.example",
                                                              "tracker-token")
    assert settings.metrics_port == 9300 and settings.resync_seconds == 15.0
    assert settings.max_concurrent_reconciles == 4
    assert settings.worker_config().pin_digest == "a" * 64


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


def test_expectations_hide_the_lag_between_our_writes_and_the_watch() -> None:
    from meshnet.operator.expectations import TTL_SECONDS, Expectations
    from meshnet.reconcile import ObservedPod

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
