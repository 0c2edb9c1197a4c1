"""The links document a measuring Job hands back as its termination message: it reads back
as measured, fits the kubelet's 4 KiB for 9 machines, and anything else is refused; the
command writes it, or why it failed, to --termination-log."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from meshnet.placement.order import MeasuredLink
from meshnet.placement.report import MAX_BYTES, ReportError, links_document, read_links

MESHNET = Path(sys.executable).parent / "meshnet"


def test_nine_machines_links_fit_a_termination_message_and_read_back() -> None:
    machines = [f"gke-pool-gpu-h100-{i:02d}-a1b2c3d4" for i in range(9)]
    links = {(a, b): MeasuredLink(0.0123456789, 1.23456789e9)
             for a, b in itertools.permutations(machines, 2)}
    text = links_document(machines, links)
    assert len(text.encode()) <= MAX_BYTES
    found, read = read_links(text)
    assert found == machines and len(read) == 72
    assert read[machines[0], machines[1]].rtt_s == pytest.approx(0.0123456789, rel=1e-5)
    assert read[machines[0], machines[1]].bytes_per_s == pytest.approx(1.23456789e9, rel=1e-3)


@pytest.mark.parametrize("text", ["", "Error: probe agent 10.0.0.1:7070: timed out",
                                  '{"machines": ["a"], "links": [[0, 1, 0.1, 1e6]]}',
                                  '{"machines": ["a", "b"], "links": [[0, 1, -1, 1e6]]}'])
def test_anything_but_a_measurement_is_refused(text: str) -> None:
    with pytest.raises(ReportError):
        read_links(text)


def test_the_command_writes_why_it_failed_to_the_termination_log(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    done = subprocess.run([str(MESHNET), "links", "place", "a=127.0.0.1:1", "b=127.0.0.1:2",
                           "--termination-log", str(log), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "probe agent 127.0.0.1:1" in log.read_text()
