"""Validation of reports against the published schema (what a Tracker can do on receipt)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from meshnet.tracker.schema import report_schema


def report_errors(report: Mapping[str, Any], schema: Mapping[str, Any] | None = None
                  ) -> list[str]:
    """Every schema violation of one report, as 'path: message' (empty: it is valid)."""
    validator = Draft202012Validator(schema or report_schema())
    return [f"{'/'.join(str(p) for p in error.absolute_path) or '(report)'}: {error.message}"
            for error in sorted(validator.iter_errors(report), key=lambda e: list(e.path))]
