"""judge(): canary vs stable figures against thresholds, over the edge cases; thresholds; status round trip."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvpilot.operator.analysis import AnalysisResult, Check, Figures, Thresholds, judge, thresholds_from_spec
from kvpilot.operator.analysis.prometheus import PrometheusProvider, _single_value
from kvpilot.operator.analysis.provider import ProviderUnavailable, QueryError, provider_for
from kvpilot.operator.analysis.run import analyse
from tests.harness.prometheus import free_port

pytestmark = pytest.mark.unit

AT = "2026-12-01T15:00:00Z"
HEALTHY = Figures(requests=200, ttft_p95=0.05, tpot_p95=0.01, error_rate=0.0, restarts=0, oom_events=0,
                  fallbacks_per_request=0.0, kv_cache_efficiency=0.9, preemptions_per_request=0.0)
T = Thresholds()


def run(canary: Figures, stable: Figures = HEALTHY, t: Thresholds = T, extra: tuple[Check, ...] = ()) -> AnalysisResult:
    return judge(canary, stable, t, 60, AT, extra)


def test_healthy_canary_passes_with_every_check_held() -> None:
    result = run(dataclasses.replace(HEALTHY, ttft_p95=0.07))
    assert result.verdict == "pass" and result.reason == "ChecksPassed"
    assert all(c.ok is True for c in result.checks)
    assert result.check("ttftP95Ratio").canary == 0.07 and result.check("ttftP95Ratio").stable == 0.05


@pytest.mark.parametrize("change, check, reason", [
    ({"ttft_p95": 0.08}, "ttftP95Ratio", "TtftP95RatioBreached"),       # 1.6x > 1.5x
    ({"tpot_p95": 0.02}, "tpotP95Ratio", "TpotP95RatioBreached"),
    ({"error_rate": 0.02}, "errorRate", "ErrorRateBreached"),
    ({"restarts": 1}, "restarts", "RestartsBreached"),
    ({"oom_events": 1}, "oomEvents", "OomEventsBreached"),
    ({"fallbacks_per_request": 0.2}, "fallbackRate", "FallbackRateBreached"),
    ({"kv_cache_efficiency": 0.3}, "kvCacheEfficiency", "KvCacheEfficiencyBreached"),
    ({"preemptions_per_request": 0.5}, "preemptionRate", "PreemptionRateBreached"),
])
def test_each_breach_fails_and_names_itself(change: dict, check: str, reason: str) -> None:
    result = run(dataclasses.replace(HEALTHY, **change))
    assert result.verdict == "fail" and result.reason == reason
    assert result.check(check).ok is False
    assert [c.name for c in result.checks if c.ok is False] == [check]


def test_limits_are_inclusive() -> None:
    at_limit = dataclasses.replace(HEALTHY, ttft_p95=0.075, error_rate=0.01, kv_cache_efficiency=0.5)
    assert run(at_limit).verdict == "pass"


@pytest.mark.parametrize("requests", [None, 0, 19])
def test_too_few_requests_on_either_track_is_inconclusive(requests: float | None) -> None:
    for canary, stable in ((dataclasses.replace(HEALTHY, requests=requests), HEALTHY),
                           (HEALTHY, dataclasses.replace(HEALTHY, requests=requests))):
        result = run(canary, stable)
        assert result.verdict == "inconclusive" and result.reason == "TooFewRequests"
        assert "need 20 on each track" in result.message


def test_with_few_requests_rates_do_not_fail_but_an_oom_does() -> None:
    noisy = dataclasses.replace(HEALTHY, requests=3, error_rate=0.33, ttft_p95=1.0)
    assert run(noisy).verdict == "inconclusive"
    oom = dataclasses.replace(noisy, oom_events=1)
    assert run(oom).verdict == "fail" and run(oom).reason == "OomEventsBreached"


def test_missing_figure_is_inconclusive_not_a_pass() -> None:
    result = run(dataclasses.replace(HEALTHY, tpot_p95=None))
    assert result.verdict == "inconclusive" and result.reason == "NoData"
    assert result.check("tpotP95Ratio").ok is None and "no data" in result.message


def test_zero_minimum_efficiency_turns_that_check_off() -> None:
    idle = dataclasses.replace(HEALTHY, kv_cache_efficiency=None)
    assert run(idle).verdict == "inconclusive"
    result = run(idle, t=Thresholds(min_kv_cache_efficiency=0))
    assert result.verdict == "pass" and "not checked" in result.check("kvCacheEfficiency").message


def test_breach_outranks_missing_data() -> None:
    result = run(dataclasses.replace(HEALTHY, tpot_p95=None, error_rate=0.5))
    assert result.verdict == "fail" and result.reason == "ErrorRateBreached"


def test_zero_stable_latency_does_not_divide_by_zero() -> None:
    stable = dataclasses.replace(HEALTHY, ttft_p95=0.0)
    assert run(dataclasses.replace(HEALTHY, ttft_p95=0.0), stable).check("ttftP95Ratio").ok is True
    assert run(HEALTHY, stable).check("ttftP95Ratio").ok is False


def test_infinite_p95_fails_and_stores_as_null() -> None:
    result = run(dataclasses.replace(HEALTHY, ttft_p95=math.inf))
    assert result.verdict == "fail"
    status = result.to_status()
    ttft = next(c for c in status["checks"] if c["name"] == "ttftP95Ratio")
    assert ttft["canary"] is None and ttft["stable"] == 0.05 and ttft["ok"] is False


def test_extra_check_counts_even_with_little_traffic() -> None:
    accuracy = Check("accuracyDelta", -3.1, -2.0, 0.1, False, "accuracy delta 1.1 > 0.1")
    result = run(dataclasses.replace(HEALTHY, requests=2), extra=(accuracy,))
    assert result.verdict == "fail" and result.reason == "AccuracyDeltaBreached"


def test_status_round_trip() -> None:
    result = run(dataclasses.replace(HEALTHY, ttft_p95=0.0612345678))
    status = result.to_status()
    assert status["verdict"] == "pass" and status["at"] == AT and status["windowSeconds"] == 60
    assert {c["name"] for c in status["checks"]} >= {"requests", "ttftP95Ratio", "kvCacheEfficiency"}
    back = AnalysisResult.from_status(status)
    assert back.verdict == result.verdict and back.reason == result.reason and len(back.checks) == len(result.checks)
    assert back.to_status() == status


def test_unknown_verdict_is_refused() -> None:
    with pytest.raises(ValueError, match="verdict must be one of"):
        AnalysisResult("maybe", (), "", "", 60, AT)  # type: ignore[arg-type]


def test_thresholds_defaults_and_spec_fields() -> None:
    assert thresholds_from_spec(None) == Thresholds()
    t = thresholds_from_spec({"minRequests": 5, "maxTtftP95Ratio": 2, "maxErrorRate": 0.05,
                              "minKvCacheEfficiency": 0.8, "probeSet": "probes", "failureLimit": 3,
                              "interval": "30s"})
    assert (t.min_requests, t.max_ttft_p95_ratio, t.max_error_rate, t.min_kv_cache_efficiency,
            t.probe_set, t.failure_limit) == (5, 2.0, 0.05, 0.8, "probes", 3)


@pytest.mark.parametrize("spec, message", [
    ({"minRequests": -1}, "minRequests must be an integer >= 0"),
    ({"minRequests": 2.5}, "minRequests must be an integer"),
    ({"failureLimit": 0}, "failureLimit must be an integer >= 1"),
    ({"maxErrorRate": 1.5}, "maxErrorRate is a ratio between 0 and 1"),
    ({"maxTtftP95Ratio": "fast"}, "maxTtftP95Ratio must be a finite number >= 0"),
    ({"probeSet": ""}, "probeSet must name a ConfigMap"),
])
def test_bad_thresholds_say_what_is_allowed(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        thresholds_from_spec(spec)


def test_prometheus_answers_are_read_as_one_number() -> None:
    assert _single_value("q", {"resultType": "vector", "result": []}) is None
    assert _single_value("q", {"resultType": "vector", "result": [{"metric": {}, "value": [1, "NaN"]}]}) is None
    assert _single_value("q", {"resultType": "vector", "result": [{"metric": {}, "value": [1, "0.25"]}]}) == 0.25
    assert _single_value("q", {"resultType": "scalar", "result": [1, "+Inf"]}) == math.inf
    with pytest.raises(QueryError, match="returned 2 series"):
        _single_value("q", {"resultType": "vector", "result": [{"value": [1, "1"]}, {"value": [1, "2"]}]})


def test_unreachable_prometheus_is_unavailable_and_analysis_inconclusive() -> None:
    provider = provider_for("prometheus", url=f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    with pytest.raises(ProviderUnavailable, match="did not answer"):
        provider.query("up")
    result = analyse(provider, "ns", "svc", 30, T)
    assert result.verdict == "inconclusive" and result.reason == "ProviderUnavailable"
    assert "metrics unavailable" in result.message and result.checks == ()


def test_provider_registry_and_url_check() -> None:
    with pytest.raises(ValueError, match="unknown metric provider 'datadog'; available: prometheus"):
        provider_for("datadog")
    with pytest.raises(ValueError, match="must start with http"):
        PrometheusProvider("prometheus:9090")
