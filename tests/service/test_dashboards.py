"""Every query of every dashboard, with its variables filled in as Grafana would, returns data from a
real Prometheus scraping real engines (stable: native attention; canary: linear attention with runtime
validation) through real sidecars, labelled namespace/service/track as a PodMonitor labels them, and
the operator's /metrics.

The operator's metrics are its own registry (kvpilot/operator/operator_metrics.py) served on a port by
prometheus-client, exactly as `kvpilot operator --metrics-port` serves it, and moved through a rollout's
story (a canary promoted, a second one rolled back) with the functions the operator calls; a real
operator would need a cluster and a gateway to get there (that is the e2e tier and the demo).

One fleet, one Prometheus and one burst of load serve every query (module-scoped fixture).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import start_http_server

from kvpilot.dashboards import DASHBOARDS
from kvpilot.dashboards.inventory import Query, format_value, interpolate, queries, variables
from kvpilot.operator import operator_metrics
from kvpilot.operator.rollout import phases
from tests.harness.fleet import EngineSpec, Fleet, send_load
from tests.harness.prometheus import PrometheusServer, free_port, prometheus_missing

pytestmark = [pytest.mark.service, pytest.mark.slow]

NAMESPACE, SERVICE = "dash-test", "chat"
SCRAPE = "1s"
RATE_INTERVAL = "10s"  # what Grafana's $__rate_interval would be for a dashboard step of a few seconds
# the canary also fails a share of requests (test-only fault flag), so the error-rate lines carry real failures
CANARY_FLAGS = ("--attention", "linear", "--linear-window", "8", "--head-utilization-every", "2",
                "--validate-every", "4", "--validation-sample-rate", "1", "--fault-error-rate", "0.25",
                "--fault-seed", "7")
STABLE_FLAGS = ("--head-utilization-every", "2")
DASHBOARD_JSON = {name: build() for name, build in DASHBOARDS.items()}


@dataclass
class Scraped:
    prom: PrometheusServer
    load_start: float
    load_end: float


def operator_story(stop: threading.Event, pause: float = 1.2) -> None:
    """What the operator records over two rollouts: a canary promoted, then one rolled back."""
    ns, svc = NAMESPACE, SERVICE
    story = [
        lambda: operator_metrics.record_status(ns, svc, phases.PROGRESSING, 0, 5),
        lambda: operator_metrics.ANALYSES.labels(ns, svc, "pass").inc(),
        lambda: operator_metrics.record_status(ns, svc, phases.PROGRESSING, 1, 50),
        lambda: operator_metrics.ACCURACY_DELTA.labels(ns, svc).set(0.004),
        lambda: operator_metrics.ANALYSES.labels(ns, svc, "pass").inc(),
        lambda: operator_metrics.PROMOTIONS.labels(ns, svc).inc(),
        lambda: operator_metrics.record_status(ns, svc, phases.PROMOTED, -1, 0),
        lambda: operator_metrics.record_status(ns, svc, phases.PROGRESSING, 0, 5),
        lambda: operator_metrics.ANALYSES.labels(ns, svc, "inconclusive").inc(),
        lambda: operator_metrics.ANALYSES.labels(ns, svc, "fail").inc(),
        lambda: operator_metrics.ACCURACY_DELTA.labels(ns, svc).set(0.41),
        lambda: operator_metrics.ROLLBACKS.labels(ns, svc, "AccuracyDelta").inc(),
        lambda: operator_metrics.record_status(ns, svc, phases.ROLLED_BACK, -1, 0),
    ]
    for chapter in story:
        if stop.wait(pause):
            return
        chapter()
        operator_metrics.ANALYSIS_SECONDS.observe(0.2)


@pytest.fixture(scope="module")
def scraped(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    workdir = tmp_path_factory.mktemp("dashboards")
    operator_port = free_port()
    operator_http, _ = start_http_server(operator_port, addr="127.0.0.1")  # the operator's registry
    stop = threading.Event()
    story = threading.Thread(target=operator_story, args=(stop,), daemon=True)
    try:
        with Fleet(tiny_model, workdir / "fleet") as fleet:
            stable, canary = fleet.start([EngineSpec(NAMESPACE, SERVICE, "stable", STABLE_FLAGS),
                                          EngineSpec(NAMESPACE, SERVICE, "canary", CANARY_FLAGS)])
            # the operator's job attaches no namespace/service labels: its series carry their own
            jobs = {"kvpilot-engines": fleet.targets(), "kvpilot-operator": [f"127.0.0.1:{operator_port}"]}
            with PrometheusServer(jobs, workdir / "prometheus", scrape_interval=SCRAPE) as prom:
                prom.wait_for("count(up == 1)", lambda r: bool(r) and r[0].value == 3, timeout=30)
                load_start = time.time()
                story.start()
                with ThreadPoolExecutor(2) as pool:
                    stable_codes, canary_codes = pool.map(lambda url: send_load(url, requests=16, concurrency=4),
                                                          [stable.api_url, canary.api_url])
                assert set(stable_codes) == {200}, f"stable load failed: {stable_codes}"
                assert 200 in canary_codes and 500 in canary_codes and set(canary_codes) <= {200, 500}, canary_codes
                story.join(timeout=60)
                # two more scrapes, so the last counters and gauges are stored
                asked = time.time()
                prom.wait_for("min(timestamp(up))", lambda r: bool(r) and r[0].value > asked + 1.0, timeout=15)
                yield Scraped(prom, load_start, time.time())
    finally:
        stop.set()
        operator_http.shutdown()
        operator_http.server_close()


def grafana_values(dashboard: dict[str, Any], namespace: str = NAMESPACE,
                   tracks: tuple[str, ...] = ("stable", "canary")) -> dict[str, str]:
    """The variables as a user picking the test namespace, the service and both tracks would set them."""
    picked = {"namespace": [namespace], "service": [SERVICE], "track": list(tracks)}
    values = {name: format_value(variable, picked[name])
              for name, variable in variables(dashboard).items() if name in picked}
    return {**values, "__rate_interval": RATE_INTERVAL, "__interval": "1s", "__range": "5m"}


def every_query(operator: bool) -> list[tuple[dict[str, Any], Query]]:
    return [(dashboard, query) for dashboard in DASHBOARD_JSON.values() for query in queries(dashboard)
            if query.reads_operator == operator]


def range_values(prom: PrometheusServer, expr: str, start: float, end: float) -> list[float]:
    data = prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
    return [float(value) for series in data["result"] for _, value in series["values"]]


def assert_every_query_has_data(scraped: Scraped, found: list[tuple[dict[str, Any], Query]]) -> None:
    empty = []
    for dashboard, query in found:
        expr = interpolate(query.expr, grafana_values(dashboard))
        values = range_values(scraped.prom, expr, scraped.load_start, scraped.load_end)
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{query.dashboard}: {query.where}: {expr} -> {values[:5]}")
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_the_dashboards_query_the_engines(scraped: Scraped) -> None:
    engine_queries = every_query(operator=False)
    assert len(engine_queries) > 40, "the dashboards lost their engine panels"
    assert_every_query_has_data(scraped, engine_queries)


def test_the_dashboards_query_the_operator(scraped: Scraped) -> None:
    operator_queries = every_query(operator=True)
    assert len(operator_queries) >= 12, "the rollout dashboard lost its operator panels or annotations"
    assert_every_query_has_data(scraped, operator_queries)


def annotation_marks(scraped: Scraped, name: str) -> list[float]:
    rollout = DASHBOARD_JSON["rollout.json"]
    annotation = next(a for a in rollout["annotations"]["list"] if a.get("name") == name)
    data = scraped.prom.api("query_range", query=interpolate(annotation["expr"], grafana_values(rollout)),
                            start=f"{scraped.load_start:.3f}", end=f"{scraped.load_end:.3f}", step="1")
    return sorted(float(t) for series in data["result"] for t, _ in series["values"])


def first_sample(scraped: Scraped, selector: str) -> float:
    return min(t for _, values in scraped.prom.samples(selector, "5m") for t, _ in values)


def test_error_rate_lines_show_the_canarys_failures(scraped: Scraped) -> None:
    """The rollout dashboard's error-rate panel: the faulty canary's line rises above 0, stable's stays 0."""
    rollout = DASHBOARD_JSON["rollout.json"]
    panel = next(p for p in rollout["panels"] if p["title"] == "Error rate")
    peaks = {}
    for target in panel["targets"]:
        values = range_values(scraped.prom, interpolate(target["expr"], grafana_values(rollout)),
                              scraped.load_start, scraped.load_end)
        peaks[target["legendFormat"]] = max(v for v in values if math.isfinite(v))
    assert peaks["stable"] == 0.0 and 0.0 < peaks["canary"] <= 1.0, peaks


def test_verdict_annotations_follow_their_own_verdict(scraped: Scraped) -> None:
    """The story passed twice, then failed once: the pass marks start before the fail was recorded, and
    the fail marks start no earlier than the scrape that first saw it."""
    failed = first_sample(scraped, f'kvpilot_rollout_analysis_total{{namespace="{NAMESPACE}",verdict="fail"}}')
    passes, fails = annotation_marks(scraped, "Analysis: pass"), annotation_marks(scraped, "Analysis: fail")
    assert passes and fails
    assert passes[0] < failed - 1.0, (passes[0], failed)
    assert fails[0] >= failed - 1.0, (fails[0], failed)


def test_every_query_is_scoped_by_the_variables(scraped: Scraped) -> None:
    """The same queries for a namespace nothing runs in return nothing (no query ignores $namespace)."""
    leaking = []
    for dashboard, query in every_query(operator=False) + every_query(operator=True):
        expr = interpolate(query.expr, grafana_values(dashboard, namespace="nowhere"))
        if range_values(scraped.prom, expr, scraped.load_start, scraped.load_end):
            leaking.append(f"{query.dashboard}: {query.where}: {expr}")
    assert not leaking, "queries that ignore the namespace variable:\n" + "\n".join(leaking)


def test_the_track_picker_hides_a_track(scraped: Scraped) -> None:
    """With only stable picked, every query drawn as the canary's line returns nothing, stable's still data."""
    shown, hidden = [], []
    for dashboard, query in every_query(operator=False):
        if query.legend not in ("stable", "canary"):
            continue
        expr = interpolate(query.expr, grafana_values(dashboard, tracks=("stable",)))
        values = range_values(scraped.prom, expr, scraped.load_start, scraped.load_end)
        (shown if values else hidden).append((query.legend, f"{query.dashboard}: {query.where}"))
    assert hidden and all(legend == "canary" for legend, _ in hidden), hidden
    assert shown and all(legend == "stable" for legend, _ in shown), shown


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
