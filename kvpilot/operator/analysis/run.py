"""`analyse`: ask a MetricProvider for both tracks' figures over the step's window and judge them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from kvpilot import promql
from kvpilot.operator.analysis.gateway import GatewayQueries
from kvpilot.operator.analysis.judge import Figures, inconclusive, judge
from kvpilot.operator.analysis.provider import MetricProvider, ProviderUnavailable
from kvpilot.operator.analysis.result import AnalysisResult, Check
from kvpilot.operator.analysis.thresholds import Thresholds

TRACKS = ("canary", "stable")


def rfc3339(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def window(window_s: float) -> str:
    if window_s < 1:
        raise ValueError(f"the analysis window must be at least 1 s, got {window_s}")
    return f"{round(window_s)}s"


def queries(namespace: str, service: str, track: str, window_s: float) -> dict[str, str]:
    """Figures field -> PromQL, for one track."""
    m, w = promql.matchers(namespace, service, track), window(window_s)
    return {
        "requests": promql.requests_in_window(m, w),
        "ttft_p95": promql.ttft_p95(m, w),
        "tpot_p95": promql.tpot_p95(m, w),
        "error_rate": promql.error_rate(m, w),
        "restarts": promql.restarts(m, w),
        "oom_events": promql.oom_events(m, w),
        "fallbacks_per_request": promql.fallbacks_per_request(m, w),
        "kv_cache_efficiency": promql.kv_cache_efficiency_over(m, w),
        "preemptions_per_request": promql.preemptions_per_request(m, w),
    }


def gateway_queries_for(gateway: GatewayQueries | None, namespace: str, service: str, track: str,
                        window_s: float) -> dict[str, str]:
    if gateway is None:
        return {}
    requests, errors = gateway.render(namespace, service, track, window(window_s))
    return {"gateway_requests": requests, "gateway_errors": errors}


def figures(provider: MetricProvider, namespace: str, service: str, track: str, window_s: float,
            at: float | None = None, gateway: GatewayQueries | None = None) -> Figures:
    wanted = {**queries(namespace, service, track, window_s),
              **gateway_queries_for(gateway, namespace, service, track, window_s)}
    return Figures(**{field: provider.query(q, at) for field, q in wanted.items()})


def analyse(provider: MetricProvider, namespace: str, service: str, window_s: float, thresholds: Thresholds,
            now: datetime | None = None, extra_checks: Sequence[Check] = (),
            gateway: GatewayQueries | None = None) -> AnalysisResult:
    """Canary against stable over the `window_s` seconds before `now`; an unreachable provider is inconclusive.

    `gateway`: the Gateway's request and 5xx queries (analysis/gateway.py); None leaves that check off.
    """
    now = now or datetime.now(UTC)
    at = rfc3339(now)
    try:
        canary, stable = (figures(provider, namespace, service, track, window_s, now.timestamp(), gateway)
                          for track in TRACKS)
    except ProviderUnavailable as exc:
        return inconclusive("ProviderUnavailable", f"metrics unavailable, not promoting: {exc}", window_s, at)
    return judge(canary, stable, thresholds, window_s, at, extra_checks, gateway.source if gateway else "")
