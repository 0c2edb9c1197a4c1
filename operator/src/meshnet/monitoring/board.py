"""A dashboard under construction, over grafana-foundation-sdk: the few panel kinds our
dashboards use, one Prometheus datasource variable, and a record of the panels that may
rightly stay empty after ordinary traffic (the end-to-end test asks the others for data)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as options
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana's own: at least four scrape intervals, so a rate always has two samples.
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass
class Board:
    """One dashboard: `uid`, `title`, and its panels in rows of a 24-column grid."""

    uid: str
    title: str
    description: str
    variables: tuple[tuple[str, str], ...] = ()  # (name, label_values query), in order
    # Panel title -> why it may have no data after a generation (e.g. no failure yet).
    quiet: dict[str, str] = field(default_factory=dict)
    _builder: dashboard.Dashboard = field(init=False)
    _next_id: int = field(init=False, default=1)

    def __post_init__(self) -> None:
        self._builder = (
            dashboard.Dashboard(self.title).uid(self.uid).description(self.description)
            .tags(["meshnet"]).refresh("30s").time("now-1h", "now").timezone("browser")
            .editable()
            .with_variable(dashboard.DatasourceVariable("datasource").label("Data source")
                           .type("prometheus")))
        for name, query in self.variables:
            self._builder.with_variable(
                dashboard.QueryVariable(name).label(name.capitalize()).datasource(DATASOURCE)
                .query(query).multi(True).include_all(True).all_value(".*")
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))

    def row(self, title: str) -> Board:
        self._builder.with_row(dashboard.Row(title).id(self._take_id()))
        return self

    def graph(self, title: str, description: str, unit: str, *queries: Query,
              width: int = 12, quiet: str = "") -> Board:
        """A time series panel; `quiet` says why it may rightly show nothing."""
        panel = (timeseries.Panel().line_width(1).fill_opacity(10)
                 .legend(common.VizLegendOptions().show_legend(True)
                         .display_mode(options.LegendDisplayMode.LIST)
                         .placement(options.LegendPlacement.BOTTOM))
                 .tooltip(common.VizTooltipOptions().mode(options.TooltipDisplayMode.MULTI)
                          .sort(options.SortOrder.DESCENDING)))
        return self._add(panel, title, description, unit, queries, width, 8, quiet)

    def single(self, title: str, description: str, unit: str, *queries: Query,
               width: int = 6, quiet: str = "") -> Board:
        """A stat panel: the latest value of each series."""
        panel = (stat.Panel().graph_mode(options.BigValueGraphMode.AREA)
                 .color_mode(options.BigValueColorMode.VALUE)
                 .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"])))
        return self._add(panel, title, description, unit, queries, width, 4, quiet)

    def _add(self, panel: Any, title: str, description: str, unit: str,
             queries: tuple[Query, ...], width: int, height: int, quiet: str) -> Board:
        panel.id(self._take_id()).title(title).description(description).unit(unit)
        panel.datasource(DATASOURCE).span(width).height(height)
        for ref, query in zip("ABCDEFGH", queries, strict=False):
            panel.with_target(prometheus.Dataquery().ref_id(ref).expr(query.expr)
                              .legend_format(query.legend or "__auto"))
        self._builder.with_panel(panel)
        if quiet:
            self.quiet[title] = quiet
        return self

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def to_json(self) -> str:
        """The dashboard model, stable byte for byte (the checked-in files are compared)."""
        model = json.loads(json.dumps(self._builder.build(), cls=JSONEncoder))
        return json.dumps(model, indent=2, sort_keys=True) + "\n"
