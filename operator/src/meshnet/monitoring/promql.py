"""The metric names a PromQL expression reads, for the lint that every name a panel or
alert uses is exported by some component. A scanner, not a parser: Prometheus itself
parses every expression in the end-to-end test; this only has to find the selectors."""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_WORD = re.compile(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset",
             "bool", "and", "or", "unless", "inf", "nan", "Inf", "NaN"}


def metric_names(expr: str) -> set[str]:
    """{'up', 'meshnet_x_total'} for 'sum by (a) (rate(meshnet_x_total{b="c"}[5m])) * up'."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _WORD.finditer(text):
        if text[match.end():].lstrip().startswith("("):
            continue  # a function or an aggregation
        if match.group() not in _KEYWORDS:
            names.add(match.group())
    return names
