"""Runs the operator: kopf with our registry, settings and login, plus the metrics port."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import kopf
from prometheus_client import start_http_server

from meshnet.api import GROUP
from meshnet.metrics.controller import OperatorMetrics
from meshnet.operator import tracker_daemon
from meshnet.operator.artifact_handlers import register as register_artifacts
from meshnet.operator.context import Context
from meshnet.operator.handlers import register
from meshnet.operator.kube import Connection, KubeClient
from meshnet.operator.settings import OperatorSettings


def build_registry(ctx: Context, connection: Connection) -> kopf.OperatorRegistry:
    """Our handlers, kopf's settings and a login that uses the same connection as ctx.client."""
    registry = kopf.OperatorRegistry()
    register(registry, ctx)
    register_artifacts(registry, ctx)  # ModelArtifact provisioning Jobs and node labels
    tracker_daemon.register(registry, ctx)  # capacity reports and certification

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{GROUP}/children"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration")
        settings.posting.level = logging.WARNING  # our own events carry the story
        settings.watching.server_timeout = 300

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection.kopf_info()

    return registry


async def run(settings: OperatorSettings, connection: Connection,
              stop_flag: asyncio.Event | threading.Event | None = None,
              ready_flag: asyncio.Event | threading.Event | None = None,
              metrics: OperatorMetrics | None = None) -> None:
    """Until stop_flag is set (or forever): reconcile ShardRoutes in the configured namespaces."""
    ctx = Context(settings, KubeClient(connection), metrics or OperatorMetrics())
    if settings.metrics_port:
        start_http_server(settings.metrics_port, registry=ctx.metrics.registry)
    liveness = f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None
    try:
        await kopf.operator(
            registry=build_registry(ctx, connection), standalone=True,
            clusterwide=not settings.namespaces, namespaces=settings.namespaces,
            liveness_endpoint=liveness, stop_flag=stop_flag, ready_flag=ready_flag,
        )
    finally:
        await ctx.client.close()
