"""Gateway-side 5xx in the canary analysis: the check, its own volume rule, the query templates."""

from __future__ import annotations

import dataclasses

import pytest

from kvpilot.operator.analysis import Figures, Thresholds, judge, thresholds_from_spec
from kvpilot.operator.analysis.gateway import PRESETS, GatewayQueries, gateway_queries
from kvpilot.operator.analysis.judge import GATEWAY_CHECK
from kvpilot.operator.analysis.run import analyse

pytestmark = pytest.mark.unit
AT = "2026-12-01T15:00:00Z"
HEALTHY = Figures(requests=200, ttft_p95=0.05, tpot_p95=0.01, error_rate=0.0, restarts=0, oom_events=0,
                  fallbacks_per_request=0.0, kv_cache_efficiency=0.9, preemptions_per_request=0.0,
                  gateway_requests=200, gateway_errors=0)
T = Thresholds()


def run(canary: Figures, gateway: str = "kvpilot-local"):  # type: ignore[no-untyped-def]
    return judge(canary, HEALTHY, T, 60, AT, gateway=gateway)


def test_gateway_5xx_fail_a_canary_whose_engine_saw_no_error() -> None:
    result = run(dataclasses.replace(HEALTHY, gateway_requests=220, gateway_errors=20))
    assert result.verdict == "fail" and result.reason == "GatewayErrorRateBreached"
    check = result.check(GATEWAY_CHECK)
    assert check is not None and check.ok is False and "20 of 220" in check.message


def test_a_canary_the_engine_barely_saw_still_fails_on_the_gateways_count() -> None:
    """Crashed pods: the engine ended 3 requests (too few to judge), the gateway answered 40 with 502/503."""
    result = run(dataclasses.replace(HEALTHY, requests=3, gateway_requests=43, gateway_errors=40))
    assert result.verdict == "fail" and result.reason == "GatewayErrorRateBreached"


def test_few_gateway_requests_decide_nothing_and_no_5xx_series_is_zero() -> None:
    assert run(dataclasses.replace(HEALTHY, requests=3, gateway_requests=3, gateway_errors=3)).reason == "TooFewRequests"
    assert run(dataclasses.replace(HEALTHY, gateway_requests=5, gateway_errors=0)).reason == "NoData"
    assert run(dataclasses.replace(HEALTHY, gateway_errors=None)).verdict == "pass"


def test_without_gateway_metrics_the_check_is_off_and_says_so() -> None:
    result = run(dataclasses.replace(HEALTHY, gateway_requests=None, gateway_errors=None), gateway="")
    assert result.verdict == "pass"
    check = result.check(GATEWAY_CHECK)
    assert check is not None and check.ok is True and "--gateway-metrics" in check.message


def test_threshold_from_the_spec() -> None:
    assert thresholds_from_spec({"maxGatewayErrorRate": 0.05}).max_gateway_error_rate == 0.05
    with pytest.raises(ValueError, match="maxGatewayErrorRate is a ratio between 0 and 1"):
        thresholds_from_spec({"maxGatewayErrorRate": 5})


def test_templates_render_per_track_backend() -> None:
    requests, errors = PRESETS["kvpilot-local"].render("llm", "chat", "canary", "30s")
    assert requests == 'sum(increase(kvpilot_gateway_requests_total{namespace="llm",service="chat-canary"}[30s]))'
    assert errors == ('sum(increase(kvpilot_gateway_requests_total{namespace="llm",service="chat-canary",'
                      'code=~"5.."}[30s]))')
    assert 'destination_service_name="chat"' in PRESETS["istio"].render("llm", "chat", "stable", "1m")[0]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"preset": "nginx-plus"}, "known are istio, kvpilot-local"),
    ({"requests": "sum(x)"}, "go together"),
    ({"preset": "istio", "errors": "y"}, "exclude each other"),
    ({"requests": "sum(x{ns=\"$ns\"})", "errors": "y"}, "unknown or malformed placeholder"),
])
def test_bad_flags_say_what_is_allowed(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gateway_queries(**kwargs)


def test_analyse_asks_the_provider_for_both_gateway_figures() -> None:
    asked: list[str] = []

    class Provider:
        name = "fake"

        def query(self, promql: str, at: float | None = None) -> float | None:
            asked.append(promql)
            if "kvpilot_gateway_requests_total" in promql:
                return 50.0 if 'code=~"5.."' in promql and "chat-canary" in promql else 100.0
            return None

    queries = GatewayQueries(*[PRESETS["kvpilot-local"].requests, PRESETS["kvpilot-local"].errors], source="local")
    result = analyse(Provider(), "llm", "chat", 30, T, gateway=queries)
    assert result.verdict == "fail" and result.reason == "GatewayErrorRateBreached"
    assert sum("kvpilot_gateway_requests_total" in q for q in asked) == 4
