"""The chart's tracker and certify values reach the operator as the settings it reads."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from meshnet.devtools.kube_tools import install
from meshnet.paths import repo_root
from meshnet.tracker.settings import TrackerSettings

CHART = repo_root() / "charts/meshnet-shard-operator"


def operator_env(values: Path | None = None) -> dict[str, str]:
    args = [str(install()["helm"]), "template", "meshnet", str(CHART), "-n", "meshnet-system"]
    if values is not None:
        args += ["-f", str(values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(result.stdout) if d]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_chart_values_become_the_tracker_and_certification_settings(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "tracker": {"providerId": "acme", "clusterId": "eu-west-7", "sampleSeconds": 10,
                    "reportSeconds": 60},
        "certify": {"images": {"cuda": "meshnet/certify-cuda:0.1.0"}, "speedFraction": 0.8,
                    "tolerance": 0.01}}))
    env = operator_env(values)

    settings = TrackerSettings.from_env(env)

    assert (settings.provider_id, settings.cluster_id) == ("acme", "eu-west-7")
    assert (settings.sample_seconds, settings.report_seconds) == (10.0, 60.0)
    assert settings.certify_images == {"cuda": "meshnet/certify-cuda:0.1.0"}
    assert (settings.gates.speed_fraction, settings.gates.tolerance) == (0.8, 0.01)


def test_by_default_no_lane_is_certified_in_the_cluster_and_the_cluster_id_is_found() -> None:
    settings = TrackerSettings.from_env(operator_env())

    assert settings.certify_images == {} and settings.cluster_id == ""
    assert (settings.gates.speed_fraction, settings.gates.tolerance) == (0.5, 0.0)
