"""The published JSON schema of the Tracker report, generated from `meshnet.api.tracker`
and checked in under schemas/ (a test and `meshnet tracker schema --check` catch drift)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshnet.api.tracker import SCHEMA_ID, CapacityReport

SCHEMA_FILE = Path("schemas/meshnet.tracker.v1.capacityreport.schema.json")
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def report_schema() -> dict[str, Any]:
    """The schema of `meshnet.tracker/v1` CapacityReport (draft 2020-12)."""
    schema = CapacityReport.model_json_schema(by_alias=True)
    _drop_field_titles(schema)
    return {"$schema": DIALECT, "$id": SCHEMA_ID, **schema}


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def drift(root: Path) -> str | None:
    """Why the checked-in schema is not what the models generate (None: it is)."""
    path = root / SCHEMA_FILE
    if not path.is_file():
        return f"{path}: missing"
    if path.read_text() != render(report_schema()):
        return f"{path}: differs from meshnet.api.tracker"
    return None


def _drop_field_titles(node: Any) -> None:
    """pydantic titles every field after its Python name ("Routedigest"): noise for readers."""
    if isinstance(node, dict):
        for prop in (node.get("properties") or {}).values():
            if isinstance(prop, dict):
                prop.pop("title", None)
        for value in node.values():
            _drop_field_titles(value)
    elif isinstance(node, list):
        for value in node:
            _drop_field_titles(value)
