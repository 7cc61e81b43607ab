"""The committed dashboards are the generator's output, and their shape is what Grafana and users rely on:
stable uids, the datasource and namespace/service/track variables, metric names the sidecar serves.

That every query returns data from a real Prometheus is tests/service/test_dashboards.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from kvpilot.dashboards import DASHBOARDS, render
from kvpilot.dashboards.__main__ import main
from kvpilot.dashboards.inventory import format_value, interpolate, queries, variables
from kvpilot.operator import operator_metrics
from kvpilot.sidecar.schema import BY_NAME

pytestmark = pytest.mark.unit

DIRECTORY = Path(__file__).resolve().parents[2] / "dashboards"
UIDS = {"fleet-overview.json": "kvpilot-fleet-overview", "service-memory.json": "kvpilot-service-memory",
        "rollout.json": "kvpilot-rollout"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
BUILT = {name: build() for name, build in DASHBOARDS.items()}


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_committed_json_is_the_generators_output(name: str) -> None:
    committed = (DIRECTORY / name).read_text()
    assert committed == render(BUILT[name]), (
        f"dashboards/{name} differs from kvpilot/dashboards; regenerate: python -m kvpilot.dashboards write dashboards")


def test_check_command_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["write", str(tmp_path)]) == 0
    assert main(["check", str(tmp_path)]) == 0
    (tmp_path / "rollout.json").write_text("{}\n")
    assert main(["check", str(tmp_path)]) == 1
    assert "rollout.json" in capsys.readouterr().err


def test_generation_is_deterministic() -> None:
    assert {name: render(build()) for name, build in DASHBOARDS.items()} == \
        {name: render(data) for name, data in BUILT.items()}


def test_uids_are_stable_and_files_are_named_for_them() -> None:
    assert {name: data["uid"] for name, data in BUILT.items()} == UIDS
    assert sorted(path.name for path in DIRECTORY.glob("*.json")) == sorted(UIDS)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_variables_are_the_datasource_and_the_three_target_labels(name: str) -> None:
    found = variables(BUILT[name])
    assert list(found) == ["datasource", "namespace", "service", "track"]
    assert found["datasource"]["type"] == "datasource" and found["datasource"]["query"] == "prometheus"
    for label in ("namespace", "service", "track"):
        assert found[label]["datasource"] == DATASOURCE
        assert found[label]["query"].startswith("label_values(kvpilot_engine_up")
        assert found[label]["query"].endswith(f", {label})")
    assert found["track"]["multi"] and found["track"]["includeAll"]
    assert not found["namespace"]["multi"]


def _panels(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in data["panels"] if panel["type"] != "row"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_reads_the_datasource_variable(name: str) -> None:
    panels = _panels(BUILT[name])
    assert panels
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
    ids = [panel["id"] for panel in BUILT[name]["panels"]]
    assert ids == list(range(1, len(ids) + 1))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_do_not_overlap(name: str) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in BUILT[name]["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bkvpilot_[a-z0-9_]+", expr))


def operator_metric_names() -> set[str]:
    """The sample names the operator's /metrics serves (kvpilot/operator/operator_metrics.py)."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    return {family.name + suffix for metric in vars(operator_metrics).values() if isinstance(metric, MetricWrapperBase)
            for family in metric.describe() for suffix in suffixes[family.type]}


def test_every_metric_a_query_reads_is_served() -> None:
    served = set(BY_NAME) | {f"{name}_bucket" for name, spec in BY_NAME.items() if spec.type == "histogram"}
    assert "kvpilot_rollout_analysis_total" in operator_metric_names()
    known = served | operator_metric_names()
    used = {name for data in BUILT.values() for query in queries(data) for name in _metric_names(query.expr)}
    assert used - known == set(), "dashboards query metrics nobody serves"
    engine_queries = [q for data in BUILT.values() for q in queries(data) if not q.reads_operator]
    operator_queries = [q for data in BUILT.values() for q in queries(data) if q.reads_operator]
    assert engine_queries and operator_queries


def test_rollout_dashboard_marks_verdicts_promotions_and_rollbacks() -> None:
    annotations = [a for a in BUILT["rollout.json"]["annotations"]["list"] if "expr" in a]
    assert [a["name"] for a in annotations] == ["Analysis: pass", "Analysis: fail", "Analysis: inconclusive",
                                                 "Promotions", "Rollbacks"]
    for annotation in annotations:
        assert annotation["datasource"] == DATASOURCE and annotation["enable"]


def test_stable_and_canary_are_drawn_apart_with_the_shared_promql() -> None:
    from kvpilot import promql

    targets = [t for p in _panels(BUILT["rollout.json"]) if p["title"] == "Time to first token (P95)"
               for t in p["targets"]]
    assert [t["legendFormat"] for t in targets] == ["stable", "canary"]
    assert targets[1]["expr"] == promql.ttft_p95(
        'namespace=~"$namespace",service=~"$service",track=~"$track",track="canary"', "$__rate_interval")


def test_grafana_formats_variables_like_the_prometheus_datasource() -> None:
    single = {"name": "namespace", "multi": False, "includeAll": False}
    multi = {"name": "track", "multi": True, "includeAll": True}
    assert format_value(single, ["demo"]) == "demo"
    assert format_value(multi, ["stable"]) == "stable"
    assert format_value(multi, ["stable", "canary"]) == "(stable|canary)"
    assert format_value(multi, ["a.b"]) == "a\\.b"
    with pytest.raises(ValueError, match="takes one value"):
        format_value(single, ["a", "b"])


def test_interpolation_fills_both_spellings_and_refuses_unknown_variables() -> None:
    assert interpolate('x{a=~"$ns"}[${__rate_interval}]', {"ns": "demo", "__rate_interval": "1m"}) == \
        'x{a=~"demo"}[1m]'
    with pytest.raises(KeyError, match=r"\$nope"):
        interpolate("x{a=\"$nope\"}", {"ns": "demo"})


def test_json_is_plain_grafana_json() -> None:
    for name in DASHBOARDS:
        data = json.loads((DIRECTORY / name).read_text())
        assert data["schemaVersion"] >= 36 and data["title"].startswith("kvpilot / ")
        assert all(value is not None for panel in data["panels"] for value in panel.values())
