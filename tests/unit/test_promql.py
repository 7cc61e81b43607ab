"""kvpilot.promql: matchers, selectors, and every query parsed by Prometheus's own parser (promtool).

The values these queries return are checked against a real Prometheus scraping real engines in
tests/service/test_analysis_prometheus.py; here each string must at least be valid PromQL.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from kvpilot import promql
from tests.harness.prometheus import PROMTOOL_BINARY, prometheus_missing

pytestmark = pytest.mark.unit

WINDOWED = [promql.ttft_p95, promql.tpot_p95, promql.e2e_p95, promql.request_rate, promql.requests_in_window,
            promql.error_rate, promql.fallbacks_per_request, promql.preemptions_per_request, promql.restarts,
            promql.oom_events, promql.kv_cache_efficiency_over]
INSTANT = [promql.kv_cache_efficiency, promql.engine_up]


def test_matchers_name_the_three_target_labels() -> None:
    assert promql.matchers("ns", "svc") == 'namespace="ns",service="svc"'
    assert promql.matchers("ns", "svc", "canary") == 'namespace="ns",service="svc",track="canary"'


def test_matchers_keep_grafana_variables_and_escape_quotes() -> None:
    assert promql.matchers("$namespace", "$service", "$track") == \
        'namespace="$namespace",service="$service",track="$track"'
    assert promql.matchers('a"b', "c\\d") == 'namespace="a\\"b",service="c\\\\d"'


def test_selector_without_matchers_is_the_bare_name() -> None:
    assert promql.selector("kvpilot_engine_up", "") == "kvpilot_engine_up"
    assert promql.selector("kvpilot_engine_up", 'track="stable"') == 'kvpilot_engine_up{track="stable"}'


def test_p95_sums_buckets_across_pods_by_le_only() -> None:
    q = promql.ttft_p95(promql.matchers("ns", "svc", "canary"), "2m")
    assert q == ('histogram_quantile(0.95, sum by (le) '
                 '(rate(kvpilot_ttft_seconds_bucket{namespace="ns",service="svc",track="canary"}[2m])))')


def test_error_rate_counts_failed_over_finished_plus_failed() -> None:
    q = promql.error_rate('track="canary"', "1m")
    assert 'increase(kvpilot_requests_failed_total{track="canary"}[1m])' in q
    assert 'increase(kvpilot_requests_finished_total{track="canary"}[1m])' in q
    # failed may have no series yet (labelled counter): it reads as 0, finished does not
    assert q.count("or vector(0)") == 2
    assert "kvpilot_requests_finished_total{track=\"canary\"}[1m])) + " in q


def test_kv_efficiency_sums_numerator_and_denominator_separately() -> None:
    assert promql.kv_cache_efficiency('service="s"') == \
        '(sum(kvpilot_kv_live_tokens{service="s"}) / sum(kvpilot_kv_allocated_tokens{service="s"}))'


@pytest.mark.parametrize("m", [promql.matchers("ns", "svc", "canary"), 'namespace=~"$namespace"', ""])
def test_every_query_is_valid_promql(tmp_path, m: str) -> None:  # type: ignore[no-untyped-def]
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    exprs = [f(m, "5m") for f in WINDOWED] + [f(m) for f in INSTANT]
    exprs += [f(m, "$__rate_interval").replace("$__rate_interval", "1m") for f in WINDOWED]
    rules = {"groups": [{"name": "kvpilot", "rules": [
        {"record": f"kvpilot:check_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))
    result = subprocess.run([PROMTOOL_BINARY, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


def test_promtool_rejects_a_broken_query(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The check above can fail: an unbalanced query is refused by the same parser."""
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "g", "rules": [
        {"record": "x:y", "expr": promql.ttft_p95("", "5m")[:-1]}]}]}))
    result = subprocess.run([PROMTOOL_BINARY, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode != 0
