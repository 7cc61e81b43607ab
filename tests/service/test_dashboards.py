"""Every query of every dashboard, with its variables filled in as Grafana would, returns data from a
real Prometheus scraping real engines (stable: native attention; canary: linear attention with runtime
validation) through real sidecars, labelled namespace/service/track as a PodMonitor labels them.

One fleet, one Prometheus and one burst of load serve every query (module-scoped fixture).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvpilot.dashboards import DASHBOARDS
from kvpilot.dashboards.inventory import Query, format_value, interpolate, queries, variables
from tests.harness.fleet import EngineSpec, Fleet, send_load
from tests.harness.prometheus import PrometheusServer, prometheus_missing

pytestmark = [pytest.mark.service, pytest.mark.slow]

NAMESPACE, SERVICE = "dash-test", "chat"
SCRAPE = "1s"
RATE_INTERVAL = "10s"  # what Grafana's $__rate_interval would be for a dashboard step of a few seconds
CANARY_FLAGS = ("--attention", "linear", "--linear-window", "8", "--head-utilization-every", "2",
                "--validate-every", "4", "--validation-sample-rate", "1")
STABLE_FLAGS = ("--head-utilization-every", "2")
DASHBOARD_JSON = {name: build() for name, build in DASHBOARDS.items()}


@dataclass
class Scraped:
    prom: PrometheusServer
    load_start: float
    load_end: float


@pytest.fixture(scope="module")
def scraped(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    workdir = tmp_path_factory.mktemp("dashboards")
    with Fleet(tiny_model, workdir / "fleet") as fleet:
        stable, canary = fleet.start([EngineSpec(NAMESPACE, SERVICE, "stable", STABLE_FLAGS),
                                      EngineSpec(NAMESPACE, SERVICE, "canary", CANARY_FLAGS)])
        with PrometheusServer({"kvpilot-engines": fleet.targets()}, workdir / "prometheus",
                              scrape_interval=SCRAPE) as prom:
            prom.wait_for("sum(kvpilot_engine_up)", lambda r: bool(r) and r[0].value == 2, timeout=30)
            load_start = time.time()
            with ThreadPoolExecutor(2) as pool:
                codes = [code for batch in pool.map(lambda url: send_load(url, requests=16, concurrency=4),
                                                    [stable.api_url, canary.api_url]) for code in batch]
            assert codes == [200] * len(codes), f"load failed: {codes}"
            # two more scrapes, so the last counters and gauges are stored
            asked = time.time()
            prom.wait_for("max(timestamp(kvpilot_engine_up))",
                          lambda r: bool(r) and r[0].value > asked + 1.0, timeout=15)
            yield Scraped(prom, load_start, time.time())


def grafana_values(dashboard: dict[str, Any], namespace: str = NAMESPACE) -> dict[str, str]:
    """The variables as a user picking the test namespace, the service and All tracks would set them."""
    picked = {"namespace": [namespace], "service": [SERVICE], "track": ["stable", "canary"]}
    values = {name: format_value(variable, picked[name])
              for name, variable in variables(dashboard).items() if name in picked}
    return {**values, "__rate_interval": RATE_INTERVAL, "__interval": "1s", "__range": "5m"}


def every_query(operator: bool) -> list[tuple[dict[str, Any], Query]]:
    return [(dashboard, query) for dashboard in DASHBOARD_JSON.values() for query in queries(dashboard)
            if query.reads_operator == operator]


def range_values(prom: PrometheusServer, expr: str, start: float, end: float) -> list[float]:
    data = prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
    return [float(value) for series in data["result"] for _, value in series["values"]]


def test_the_dashboards_query_the_engines(scraped: Scraped) -> None:
    empty = []
    engine_queries = every_query(operator=False)
    assert len(engine_queries) > 40, "the dashboards lost their engine panels"
    for dashboard, query in engine_queries:
        expr = interpolate(query.expr, grafana_values(dashboard))
        values = range_values(scraped.prom, expr, scraped.load_start, scraped.load_end)
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{query.dashboard}: {query.where}: {expr} -> {values[:5]}")
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_every_query_is_scoped_by_the_variables(scraped: Scraped) -> None:
    """The same queries for a namespace nothing runs in return nothing (no query ignores $namespace)."""
    leaking = []
    for dashboard, query in every_query(operator=False):
        expr = interpolate(query.expr, grafana_values(dashboard, namespace="nowhere"))
        if range_values(scraped.prom, expr, scraped.load_start, scraped.load_end):
            leaking.append(f"{query.dashboard}: {query.where}: {expr}")
    assert not leaking, "queries that ignore the namespace variable:\n" + "\n".join(leaking)


def test_the_variables_list_what_runs(scraped: Scraped) -> None:
    """Each label_values() variable query, run as Grafana runs it (the label-values API), lists our labels."""
    expected = {"namespace": [NAMESPACE], "service": [SERVICE], "track": ["canary", "stable"]}
    for dashboard in DASHBOARD_JSON.values():
        for name, variable in variables(dashboard).items():
            if variable["type"] != "query":
                continue
            selector, label = variable["query"].removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
            selector = interpolate(selector, grafana_values(dashboard))
            found = scraped.prom.api(f"label/{label}/values", **{"match[]": selector})
            assert sorted(found) == expected[name], (dashboard["uid"], name, selector, found)
