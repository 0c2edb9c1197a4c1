"""meshnet-grpc-hop, the gRPC hand-off floor that bench/route_bench.py prints: two real
processes taking turns over one Relay stream."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def test_grpc_hop_measures_round_trips_between_two_processes(shard_worker: Path) -> None:
    tool = shard_worker.parent / "meshnet-grpc-hop"
    result = subprocess.run(
        [str(tool), "--compute-us", "200", "--threads", "1", "--rounds", "20"],
        capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(result.stdout)
    assert report["rounds"] == 20 and report["compute_us"] == 200 and report["bytes"] == 2304
    assert 0 < report["p10_us"] <= report["median_us"] <= report["p90_us"]


def test_grpc_hop_refuses_unknown_flags_with_usage(shard_worker: Path) -> None:
    tool = shard_worker.parent / "meshnet-grpc-hop"
    result = subprocess.run([str(tool), "--rounds", "5"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert "usage:" in result.stderr and result.stdout == ""
