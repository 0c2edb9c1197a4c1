"""Certificates of routes run by `meshnet up`, kept on this machine by lane (a cluster
keeps them in ShardRoute status instead)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from meshnet.api.certification import Certificate, CertifiedLane
from meshnet.paths import cache_dir


def store_dir() -> Path:
    return cache_dir() / "certificates"


def save(certificate: Certificate) -> Path:
    """Keeps the latest certificate of its lane (pass or fail); returns the file."""
    path = store_dir() / f"{certificate.lane.key()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(certificate.model_dump_json(by_alias=True, indent=2) + "\n")
    tmp.replace(path)
    return path


def load(lane: CertifiedLane) -> Certificate | None:
    """The latest certificate of exactly this lane, if one was recorded."""
    try:
        return Certificate.model_validate_json((store_dir() / f"{lane.key()}.json").read_text())
    except (OSError, ValidationError):
        return None
