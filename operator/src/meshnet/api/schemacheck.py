"""Checks an object against a CRD's openAPIV3Schema offline, as the API server would:
the structural schema (unknown fields refused, like kubectl's strict field validation)
and every `x-kubernetes-validations` CEL rule."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

import cel
import jsonschema

from meshnet.api.checks import Problem


def check(obj: Any, schema: dict[str, Any]) -> list[Problem]:
    """Schema problems first; CEL rules run where the schema held (as in the API server)."""
    problems = list(_schema_problems(obj, schema))
    failed = {p.path for p in problems}
    problems += _cel_problems(obj, schema, "", failed)
    return problems


def _schema_problems(obj: Any, schema: dict[str, Any]) -> Iterator[Problem]:
    validator = jsonschema.Draft202012Validator(_strict(schema))
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        yield Problem(_path(error.absolute_path), error.message)


def _strict(node: dict[str, Any]) -> dict[str, Any]:
    """Copy of a structural schema in which unknown properties are errors."""
    out = dict(node)
    if "properties" in node:
        out["properties"] = {k: _strict(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = _strict(node[key])
    return out


def _cel_problems(obj: Any, schema: dict[str, Any], path: str, failed: set[str]) -> list[Problem]:
    if obj is None or any(f == path or f.startswith(path + ".") or f.startswith(path + "[")
                          for f in failed if path):
        return []
    problems = [p for r in schema.get("x-kubernetes-validations", []) if (p := _run(r, obj, path))]
    for key, child, child_schema in _children(obj, schema):
        problems += _cel_problems(child, child_schema, _join(path, key), failed)
    return problems


def _children(obj: Any, schema: dict[str, Any]) -> Iterable[tuple[str | int, Any, dict[str, Any]]]:
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                yield key, value, sub
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            yield i, value, schema["items"]


def _run(rule: dict[str, str], obj: Any, path: str) -> Problem | None:
    where = path + rule.get("fieldPath", "")
    try:
        ok = _compiled(rule["rule"]).execute({"self": obj})
    except Exception as exc:  # the library raises plain KeyError/ValueError/TypeError
        return Problem(where, f"{rule['message']} (rule could not be evaluated: {exc})")
    return None if ok is True else Problem(where, rule["message"])


@lru_cache(maxsize=256)
def _compiled(expression: str) -> Any:
    return cel.compile(expression)


def _join(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)


def _path(parts: Iterable[str | int]) -> str:
    path = ""
    for part in parts:
        path = _join(path, part)
    return path
