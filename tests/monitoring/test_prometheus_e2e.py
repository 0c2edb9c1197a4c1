"""A real Prometheus scrapes a `meshnet up` route (its three workers, its gateway and its
operator-side metrics), a generation goes through the route and one through its gateway,
and then every PromQL expression of every dashboard panel and every alert is asked of
Prometheus' HTTP API: each must parse, and each panel that should show something after
that traffic must return a series."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from meshnet.local.process import free_port
from meshnet.local.registry import entry_route_key
from meshnet.metrics.controller import OperatorMetrics
from meshnet.monitoring.board import RATE
from meshnet.monitoring.generate import boards
from meshnet.monitoring.lint import exported_names, panel_queries, unexported, variable_queries
from meshnet.paths import repo_root
from meshnet.route import StageClient, StageError
from meshnet.route.proto import pb
from meshnet.tracker.metrics import TrackerMetrics

from .conftest import tool

EXAMPLE = repo_root() / "examples/local/smollm2-3stage.yaml"
SCRAPE_SECONDS = 1
# What the dashboards' template variables stand for here: every value ("All").
VARIABLES = {"$namespace": ".*", "$route": ".*", "$stage": ".*", "$artifact": ".*",
             RATE: "1m"}

pytestmark = pytest.mark.slow


def wait_for(what: str, check: Any, timeout: float, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}" + (f":\n{log.read_text()}" if log else ""))


@dataclass
class Stack:
    """`meshnet up` and the Prometheus scraping it."""

    route: dict[str, Any]
    operator_metrics: str  # host:port of `meshnet up --metrics-listen`
    gateway: str  # host:port of `meshnet up --serve`
    prometheus: httpx.Client
    env: dict[str, str]

    def query(self, expr: str) -> dict[str, Any]:
        answer: dict[str, Any] = self.prometheus.get("/api/v1/query",
                                                     params={"query": expr}).json()
        return answer

    def series(self, expr: str) -> list[dict[str, Any]]:
        answer = self.query(expr)
        assert answer["status"] == "success", f"{expr}: {answer.get('error')}"
        return list(answer["data"]["result"])


def scrape_config(route: dict[str, Any], operator: str, gateway: str,
                  rules: Path) -> dict[str, Any]:
    """What the chart's ServiceMonitor and PodMonitors give a Prometheus in a cluster: the
    operator as job meshnet-operator (its labels honoured), each stage as job meshnet-stage
    with namespace/route/stage target labels, the gateway as job meshnet-gateway."""
    stages = [{"targets": [s["metrics"]],
               "labels": {"namespace": "default", "route": route["name"], "stage": s["name"]}}
              for s in route["stages"]]
    return {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s",
                   "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "meshnet-operator", "honor_labels": True,
             "static_configs": [{"targets": [operator]}]},
            {"job_name": "meshnet-stage", "static_configs": stages},
            {"job_name": "meshnet-gateway",
             "static_configs": [{"targets": [gateway], "labels": {"namespace": "default"}}]},
        ],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, rules_file: Path) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("prometheus-e2e")
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    docs[0]["spec"]["storage"]["hostPath"]["path"] = str(tmp / "models")
    route_file = tmp / "route.yaml"
    route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    env = {**os.environ, "MESHNET_CACHE": str(tmp / "cache")}
    operator = f"127.0.0.1:{free_port()}"
    gateway = f"127.0.0.1:{free_port()}"
    up_log, prom_log = tmp / "up.log", tmp / "prometheus.log"
    with up_log.open("w") as sink:
        up = subprocess.Popen([sys.executable, "-m", "meshnet.cli", "up", "-f", str(route_file),
                               "--threads", "1", "--interval", "0.3",
                               "--metrics-listen", operator, "--serve", gateway],
                              env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    prometheus: subprocess.Popen[str] | None = None
    try:
        registry = tmp / "cache" / "routes" / "smollm2.json"
        route = wait_for("the route", lambda: registry.is_file() and len(
            (r := json.loads(registry.read_text()))["stages"]) == 3 and r, 180, up_log)
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(route, operator, gateway, rules_file)))
        web = f"127.0.0.1:{free_port()}"
        with prom_log.open("w") as sink:
            prometheus = subprocess.Popen(
                [tool("prometheus"), f"--config.file={config}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address={web}"],
                stdout=sink, stderr=subprocess.STDOUT, text=True)
        client = httpx.Client(base_url=f"http://{web}", timeout=10)
        result = Stack(route, operator, gateway, client, env)

        def all_targets_up() -> bool:
            try:
                return len([s for s in result.series("up == 1")]) == 5
            except (httpx.HTTPError, AssertionError, ValueError):  # ValueError: 503 text at start
                return False

        wait_for("Prometheus to scrape every target", all_targets_up, 60, prom_log)
        yield result
        client.close()
    finally:
        for process in (prometheus, up):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT if process is up else signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture(scope="module")
def traffic(stack: Stack) -> Stack:
    """A generation through the route, and one step of a stale epoch (which the driver
    would recover from), then long enough for Prometheus to have scraped it all."""
    result = subprocess.run([sys.executable, "-m", "meshnet.cli", "generate", "--route",
                             "smollm2", "--prompt", "The three primary colors are",
                             "--max-tokens", "16", "--ignore-eos", "--json"],
                            env=stack.env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["tokens"]) == 16
    answer = httpx.post(f"http://{stack.gateway}/v1/chat/completions", timeout=120, json={
        "model": "smollm2", "messages": [{"role": "user", "content": "Name three colors."}],
        "max_tokens": 8, "temperature": 0, "stream": True})
    assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")
    # a holder of the route key (`meshnet up` names its file), so the stage gets as far
    # as the epoch
    head = StageClient(stack.route["stages"][0]["endpoint"],
                       route_key=entry_route_key(stack.route))
    stale = pb.RouteKey(route_id=head.info().route_id, epoch=head.info().epoch + 7,
                              session_id="stale-epoch")
    with pytest.raises(StageError, match="EPOCH_MISMATCH"):
        head.forward(pb.ForwardRequest(key=stale, n_past=0, positions=[0], tokens=[1]))
    head.close()
    wait_for("the traffic in Prometheus", lambda: stack.series(
        'sum(meshnet_shard_errors_total{reason="EPOCH_MISMATCH"}) > 0'), 30)
    time.sleep(3 * SCRAPE_SECONDS)  # every counter scraped after the traffic
    return stack


def expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def finite(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in series if math.isfinite(float(s["value"][1]))]


def test_every_panel_parses_and_shows_data_after_a_generation(traffic: Stack) -> None:
    empty = []
    for board in boards():
        model = json.loads(board.to_json())
        for title, expr in panel_queries(model):
            answer = traffic.query(expand(expr))
            assert answer["status"] == "success", f"{board.uid} {title}: {answer.get('error')}"
            has_data = bool(finite(answer["data"]["result"]))
            if title not in board.quiet and not has_data:
                empty.append(f"{board.uid} / {title}: {expr}")
    assert not empty, "panels without data after a generation:\n" + "\n".join(empty)


def test_every_template_variable_offers_the_route_s_values(traffic: Stack) -> None:
    for board in boards():
        for name, selector, label in variable_queries(json.loads(board.to_json())):
            answer = traffic.prometheus.get(f"/api/v1/label/{label}/values",
                                            params={"match[]": expand(selector)}).json()
            assert answer["status"] == "success" and answer["data"], f"{board.uid} ${name}"
    route = json.loads(next(b for b in boards() if b.uid == "meshnet-route").to_json())
    ((_, selector, label),) = [v for v in variable_queries(route) if v[0] == "stage"]
    stages = traffic.prometheus.get(f"/api/v1/label/{label}/values",
                                    params={"match[]": expand(selector)}).json()["data"]
    assert sorted(stages) == ["head", "middle", "tail"]


def test_every_alert_expression_parses_and_is_evaluated_by_prometheus(
        traffic: Stack, rules_file: Path) -> None:
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            answer = traffic.query(rule["expr"])
            assert answer["status"] == "success", f"{rule['alert']}: {answer.get('error')}"
    loaded = traffic.prometheus.get("/api/v1/rules").json()["data"]["groups"]
    rules = [r for g in loaded for r in g["rules"]]
    assert len(rules) == sum(len(g["rules"]) for g in groups) >= 13
    assert all(r["health"] == "ok" for r in rules), rules
    firing = [r["name"] for r in rules if r["state"] != "inactive"]
    assert firing == [], f"a healthy route raised {firing}"


def test_the_route_is_seen_from_both_sides(traffic: Stack) -> None:
    """The operator side and the stages agree on the route they describe."""
    ((epoch,),) = [[s["value"][1]] for s in traffic.series("meshnet_route_epoch")]
    stage_epochs = {s["metric"]["stage"]: s["value"][1]
                    for s in traffic.series("meshnet_shard_epoch")}
    assert stage_epochs == {"head": epoch, "middle": epoch, "tail": epoch}
    ready = traffic.series('meshnet_stage_ready{route="smollm2"} == 1')
    assert sorted(s["metric"]["stage"] for s in ready) == ["head", "middle", "tail"]
    tokens = traffic.series("sum(meshnet_shard_tokens_processed_total)")
    assert float(tokens[0]["value"][1]) > 3 * 16  # prompt and generated tokens, every stage


def expositions(stack: Stack) -> dict[str, str]:
    """What each component exports: the operator's registries as the operator builds them
    (Tracker reporting included), `meshnet up`'s endpoint, and every worker's /metrics."""
    registry = CollectorRegistry()
    TrackerMetrics(OperatorMetrics(registry).registry)
    texts = {"operator": generate_latest(registry).decode()}
    for name, address in [("meshnet up", stack.operator_metrics), ("gateway", stack.gateway),
                          *((s["name"], s["metrics"]) for s in stack.route["stages"])]:
        texts[name] = httpx.get(f"http://{address}/metrics", timeout=10).text
    return texts


def test_every_metric_a_panel_or_alert_reads_is_exported_by_a_component(
        traffic: Stack, rules_file: Path) -> None:
    exported = set().union(*(exported_names(t) for t in expositions(traffic).values()))
    reads: list[tuple[str, str]] = []
    for board in boards():
        model = json.loads(board.to_json())
        reads += [(f"panel {board.uid} / {t}", e) for t, e in panel_queries(model)]
        reads += [(f"variable {board.uid} ${n}", s) for n, s, _ in variable_queries(model)]
    reads += [(f"alert {r['alert']}", r["expr"])
              for g in yaml.safe_load(rules_file.read_text())["groups"] for r in g["rules"]]
    assert unexported(reads, exported) == []


def test_the_exported_metrics_follow_the_prometheus_conventions(traffic: Stack) -> None:
    for name, text in expositions(traffic).items():
        result = subprocess.run([tool("promtool"), "check", "metrics"], input=text,
                                capture_output=True, text=True, timeout=60)
        problems = [line for line in (result.stdout + result.stderr).splitlines()
                    if line.strip() and not _VLLM_NAME_LINT.fullmatch(line.strip())]
        assert not problems, f"{name}: {problems}"


# The gateway also exports its load gauges under vLLM's names, which carry a colon by
# design (what inference-aware load balancers read): the one lint they are allowed to fail.
_VLLM_NAME_LINT = re.compile(r"vllm:\w+ metric names should not contain ':'")
