"""What the dashboards and alerts read, against what the components export: every metric
name a panel or rule uses must appear in some component's /metrics."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from meshnet.monitoring.promql import metric_names

# Series Prometheus writes itself for every target.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count"),
             "summary": ("_sum", "_count")}
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)", re.M)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.M)


def exported_names(exposition: str) -> set[str]:
    """Every series name a text exposition holds or declares (a labelled counter that was
    never incremented has a TYPE line and no sample yet: it still counts)."""
    names = set(_SAMPLE.findall(exposition))
    for name, kind in _TYPE.findall(exposition):
        names.add(name)
        names.update(name.removesuffix("_total") + s for s in _SUFFIXES.get(kind, ()))
    return names


def panel_queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel of a dashboard model."""
    for panel in dashboard.get("panels") or []:
        for target in panel.get("targets") or []:
            yield str(panel["title"]), str(target["expr"])


def variable_queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(variable, metric selector, label) of every `label_values(selector, label)`."""
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            match = re.fullmatch(r"label_values\((.*), (\w+)\)", str(variable["query"]))
            assert match, f"variable {variable['name']}: not label_values(...)"
            yield str(variable["name"]), match.group(1), match.group(2)


def unexported(expressions: Iterable[tuple[str, str]], exported: set[str]) -> list[str]:
    """'WHERE reads NAME' for every metric an expression reads that nothing exports."""
    known = exported | SYNTHETIC
    return [f"{where} reads {name}" for where, expr in expressions
            for name in sorted(metric_names(expr) - known)]
