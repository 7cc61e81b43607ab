"""What every kvpilot dashboard shares: the datasource, the variables, matchers, panels, and JSON.

Dashboards are built with grafana-foundation-sdk's typed builders; `to_dict` encodes one and
fills in what the SDK (10.1.0) leaves out or sets oddly, so the committed JSON is stable and
imports cleanly: sequential panel ids, letter refIds, no `"options": null`, no placeholder
variable ids, and the Prometheus annotation fields Grafana reads (`titleFormat`, `tagKeys`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TRACKS = ("stable", "canary")
RATE = "$__rate_interval"  # Grafana: at least four scrape intervals, so a rate always has two samples
TAGS = ["kvpilot"]
KV_EFFICIENCY_TARGET = 0.85  # DESIGN.md's mission-metric targets, drawn as dashed lines
SUMMARY_HIT_TARGET = 0.995
FALLBACK_COSINE = 0.92  # runtime validation sends a sequence to exact attention below this cosine


def matchers(track: str | None = None, with_track_variable: bool = True) -> str:
    """The label matchers of a panel query, in Grafana variables (regex, so multi-value and All work).

    A fixed `track` is added beside `track=~"$track"`, so a panel that draws stable and canary as
    two queries still honours the track picker (a de-selected track draws nothing).
    """
    parts = ['namespace=~"$namespace"', 'service=~"$service"']
    if with_track_variable:
        parts.append('track=~"$track"')
    if track is not None:
        parts.append(f'track="{track}"')
    return ",".join(parts)


OPERATOR_MATCHERS = 'namespace=~"$namespace",service=~"$service"'  # operator series carry no track


def datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def label_variable(name: str, label: str, query: str, multi: bool) -> db.QueryVariable:
    """A variable listing one label's values among the engines' series (Grafana's label_values)."""
    variable = (db.QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))
    if multi:
        variable = variable.multi(True).include_all(True)
    return variable


def standard_variables(multi_service: bool) -> list[Any]:
    """datasource, namespace (one), service (one, or many on the fleet view), track (any of them)."""
    return [
        datasource_variable(),
        label_variable("namespace", "Namespace", "label_values(kvpilot_engine_up, namespace)", multi=False),
        label_variable("service", "Service", 'label_values(kvpilot_engine_up{namespace=~"$namespace"}, service)',
                       multi=multi_service),
        label_variable("track", "Track",
                       'label_values(kvpilot_engine_up{namespace=~"$namespace",service=~"$service"}, track)',
                       multi=True),
    ]


@dataclass(frozen=True)
class Target:
    """One query of a panel: PromQL and the legend Grafana draws for it."""

    expr: str
    legend: str


def per_track(query: Any, *args: str) -> list[Target]:
    """The same promql.py function for stable and for canary, one query each (they sum within a track)."""
    return [Target(query(matchers(track), *args), track) for track in TRACKS]


def prometheus_query(target: Target) -> prom.Dataquery:
    return prom.Dataquery().expr(target.expr).legend_format(target.legend).range()


def graph(title: str, description: str, unit: str, targets: Sequence[Target], *, width: int = 12,
          height: int = 8, min_value: float | None = None, max_value: float | None = None,
          good_from: float | None = None) -> timeseries.Panel:
    """A time-series panel: lines, one per target; `good_from` draws a dashed target line (below: red)."""
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .span(width).height(height).line_width(1).fill_opacity(10).show_points(cm.VisibilityMode.NEVER))
    if good_from is not None:
        steps = [dm.Threshold(None, "red"), dm.Threshold(good_from, "green")]
        panel = (panel.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
                 .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED)))
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    for target in targets:
        panel = panel.with_target(prometheus_query(target))
    return panel


def prometheus_annotation(name: str, expr: str, colour: str, title: str, tags: str) -> dict[str, Any]:
    """A Prometheus annotation query (each step where `expr` has a value marks an event)."""
    return {
        "name": name, "datasource": {"type": "prometheus", "uid": "${datasource}"}, "enable": True,
        "hide": False, "iconColor": colour, "expr": expr, "step": "15s", "titleFormat": title,
        "tagKeys": tags, "textFormat": "", "useValueForTime": False,
    }  # fmt: skip


def to_dict(dashboard: db.Dashboard, annotations: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model, normalised (see the module docstring)."""
    data: dict[str, Any] = json.loads(json.dumps(dashboard.build(), cls=JSONEncoder))
    data["annotations"] = {"list": [_builtin_annotation(), *annotations]}
    for variable in data["templating"]["list"]:
        variable.pop("id", None)
    for number, panel in enumerate(data["panels"], start=1):
        panel["id"] = number
        if panel.get("options") is None:
            panel.pop("options", None)
        for index, target in enumerate(panel.get("targets", [])):
            target["refId"] = chr(ord("A") + index)
            target.setdefault("datasource", {"type": "prometheus", "uid": "${datasource}"})
    return data


def _builtin_annotation() -> dict[str, Any]:
    """Grafana's own annotations and alerts (every dashboard has it; kept so an import adds nothing)."""
    return {
        "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
    }  # fmt: skip


def base(uid: str, title: str, description: str, multi_service: bool) -> db.Dashboard:
    dashboard = (db.Dashboard(title).uid(uid).description(description).tags(TAGS).refresh("30s")
                 .time("now-1h", "now").timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR)
                 .link(db.DashboardLink("kvpilot").type(dm.DashboardLinkType.DASHBOARDS).tags(TAGS)
                       .as_dropdown(True).include_vars(True).keep_time(True)))
    for variable in standard_variables(multi_service):
        dashboard = dashboard.with_variable(variable)
    return dashboard
