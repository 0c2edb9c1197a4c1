"""Must show, on one machine: the workers of `meshnet up` reported to a loopback Tracker
by `meshnet tracker report`: not available until `meshnet certify` passes (a failing
certificate keeps it unavailable), then available with the workers' real figures; every
report received validates against the published JSON schema."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshnet.devtools.tracker import LoopbackTracker
from meshnet.local.process import free_port
from meshnet.paths import repo_root
from meshnet.pin.manifest import load_manifest
from meshnet.route.stage import StageClient
from meshnet.tracker.schema import SCHEMA_FILE
from meshnet.tracker.validate import report_errors

from .conftest import TOKEN

EXAMPLE = repo_root() / "examples" / "local" / "smollm2-3stage.yaml"


class Up:
    """`meshnet up` of the example route, with its own cache (registry, certificates)."""

    def __init__(self, tmp: Path) -> None:
        docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
        docs[0]["spec"]["storage"]["hostPath"]["path"] = str(tmp / "models")
        route_file = tmp / "route.yaml"
        route_file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        self.env = {**os.environ, "MESHNET_CACHE": str(tmp / "cache")}
        self.log = tmp / "up.log"
        self.serve = f"127.0.0.1:{free_port()}"
        self.token_file = tmp / "token"
        self.token_file.write_text(TOKEN + "\n")
        with self.log.open("w") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "meshnet.cli", "up", "-f", str(route_file),
                 "--threads", "1", "--interval", "0.3", "--serve", self.serve],
                env=self.env, stdout=sink, stderr=subprocess.STDOUT)
        self.registry = tmp / "cache" / "routes" / "smollm2.json"

    def route(self, timeout: float = 180.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"meshnet up exited:\n{self.log.read_text()}")
            try:
                entry: dict[str, Any] = json.loads(self.registry.read_text())
                if len(entry["stages"]) == 3:
                    return entry
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        pytest.fail(f"the route did not come up:\n{self.log.read_text()}")

    def meshnet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "meshnet.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=300)

    def report(self, tracker: LoopbackTracker, count: int) -> None:
        result = self.meshnet("tracker", "report", "--route", "smollm2", "--url", tracker.url,
                              "--token-file", str(self.token_file), "--provider", "test-provider",
                              "--cluster", "test-host", "--count", str(count),
                              "--interval", "0.3", "--every", "0.1")
        assert result.returncode == 0, result.stderr

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=60)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    session = Up(tmp_path)
    yield session
    session.stop()
    if session.process.poll() is None:
        session.process.kill()


def test_local_workers_are_advertised_only_once_their_lane_is_certified(
        up: Up, tracker: LoopbackTracker) -> None:
    entry = up.route()

    up.report(tracker, count=1)
    [uncertified] = tracker.accepted()
    assert not uncertified["available"]
    assert [r["reason"] for r in uncertified["unavailableReasons"]] == ["LaneNotCertified"]
    assert uncertified["capacity"]["sessionSlotsAdvertised"] == 0

    refused = up.meshnet("certify", "--route", "smollm2", "--speed-fraction", "100",
                         "--parity-steps", "2", "--repeats", "1")
    assert refused.returncode == 1, refused.stderr
    assert "FAILED" in refused.stdout and "100 is required" in refused.stdout
    up.report(tracker, count=1)
    failed = tracker.accepted()[-1]
    assert [r["reason"] for r in failed["unavailableReasons"]] == ["CertificationFailed"]

    # speed measured, not gated: a figure of the machine's load (tests/certify/conftest.py)
    passed = up.meshnet("certify", "--route", "smollm2", "--json", "--speed-fraction", "0")
    assert passed.returncode == 0, passed.stderr
    certificate = json.loads(passed.stdout)
    assert certificate["passed"] and certificate["parity"]["maxAbsDeltaLogit"] == 0.0

    up.report(tracker, count=3)
    reports = tracker.accepted()
    latest = reports[-1]
    assert len(reports) == 5 and [r["available"] for r in reports[-3:]] == [True] * 3

    published = json.loads((repo_root() / SCHEMA_FILE).read_text())
    for report in reports:
        assert report_errors(report, published) == []
    assert all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in tracker.received)

    # Real figures from the real workers.
    assert latest["certification"]["passed"]
    assert latest["certification"]["certificate"] == certificate
    assert latest["certification"]["lane"] == certificate["lane"]
    assert latest["route"] == {"name": "smollm2", "namespace": "local", "epoch": 1,
                               "routeDigest": entry["routeDigest"],
                               "endpoint": f"http://{up.serve}/v1"}
    assert latest["provider"] == {"id": "test-provider", "cluster": "test-host"}
    pin = load_manifest(repo_root() / "llama-pin.yaml")
    assert latest["recipe"]["llamaCppCommit"] == pin.upstream.commit
    assert latest["recipe"]["backend"] == "cpu" and latest["recipe"]["contextLength"] == 2048
    assert latest["artifact"]["architecture"] == "llama"
    assert latest["artifact"]["blockCount"] == 30
    assert [s["layers"] for s in latest["stages"]] == [
        {"begin": 0, "end": 10}, {"begin": 10, "end": 20}, {"begin": 20, "end": 30}]
    for stage, running in zip(latest["stages"], entry["stages"], strict=True):
        client = StageClient(running["endpoint"])
        assert stage["health"]["incarnation"] == client.info().incarnation
        client.close()
        assert stage["endpoint"] == running["endpoint"] and stage["health"]["ready"]
        assert stage["capacity"] == {"sessionSlotsFree": 4, "sessionSlotsTotal": 4,
                                     "kvTokensFree": 4 * 2048, "kvTokensTotal": 4 * 2048}
        assert stage["health"]["uptimeSeconds"] > 0
    assert [s["seam"]["boundaryBytesPerToken"] for s in latest["stages"]] == [2304, 2304, 0]
    assert latest["capacity"]["sessionSlotsAdvertised"] == 4
    assert latest["sequence"] > reports[-2]["sequence"]
