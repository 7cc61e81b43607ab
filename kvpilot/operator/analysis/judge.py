"""Pure judgement: the two tracks' figures and the thresholds in, an `AnalysisResult` out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvpilot.operator.analysis.result import AnalysisResult, Check
from kvpilot.operator.analysis.thresholds import Thresholds


@dataclass(frozen=True)
class Figures:
    """One track's figures over the analysis window (None: no data, e.g. 0/0)."""

    requests: float | None = None
    ttft_p95: float | None = None
    tpot_p95: float | None = None
    error_rate: float | None = None
    restarts: float | None = None
    oom_events: float | None = None
    fallbacks_per_request: float | None = None
    kv_cache_efficiency: float | None = None
    preemptions_per_request: float | None = None
    gateway_requests: float | None = None  # requests the Gateway answered for this track's Service
    gateway_errors: float | None = None  # ... of which 5xx (analysis/gateway.py)


def _fmt(value: float | None) -> str:
    return "no data" if value is None else f"{value:.4g}"


def _ratio_check(name: str, label: str, canary: float | None, stable: float | None, limit: float) -> Check:
    if canary is None or stable is None:
        return Check(name, canary, stable, limit, None,
                     f"{label}: no data (canary {_fmt(canary)} s, stable {_fmt(stable)} s)")
    if stable <= 0:
        ratio = 1.0 if canary <= 0 else float("inf")
    else:
        ratio = canary / stable
    ok = ratio <= limit
    return Check(name, canary, stable, limit, ok,
                 f"{label} canary {canary:.4g} s / stable {stable:.4g} s = {ratio:.3g}x "
                 f"{'<=' if ok else '>'} {limit:g}x")


def _limit_check(name: str, label: str, canary: float | None, stable: float | None, limit: float,
                 upper: bool = True) -> Check:
    if canary is None:
        return Check(name, canary, stable, limit, None, f"{label}: no data for the canary")
    ok = canary <= limit if upper else canary >= limit
    relation = ("<=" if ok else ">") if upper else (">=" if ok else "<")
    return Check(name, canary, stable, limit, ok,
                 f"{label} canary {canary:.4g} {relation} {limit:g} (stable {_fmt(stable)})")


def _efficiency_check(canary: Figures, stable: Figures, minimum: float) -> Check:
    """minKvCacheEfficiency 0 turns the check off: the gauges are 0/0 (no data) whenever no scrape in
    the window caught a live sequence, and a limit that cannot fail should not block on that."""
    if minimum <= 0:
        return Check("kvCacheEfficiency", canary.kv_cache_efficiency, stable.kv_cache_efficiency, minimum, True,
                     f"KV cache efficiency not checked (minKvCacheEfficiency 0); canary "
                     f"{_fmt(canary.kv_cache_efficiency)}, stable {_fmt(stable.kv_cache_efficiency)}")
    return _limit_check("kvCacheEfficiency", "KV cache efficiency", canary.kv_cache_efficiency,
                        stable.kv_cache_efficiency, minimum, upper=False)


GATEWAY_CHECK = "gatewayErrorRate"


def _gateway_rate(f: Figures) -> float | None:
    """No 5xx series at all is no 5xx (exporters create a status code's series at its first request)."""
    if f.gateway_requests is None or f.gateway_requests <= 0:
        return None
    return (f.gateway_errors or 0.0) / f.gateway_requests


def _gateway_check(canary: Figures, stable: Figures, t: Thresholds, gateway: str) -> Check:
    """5xx the Gateway answered for the canary's Service / every request it answered for it.

    Judged on the gateway's own count (minRequests of them), not the engine's: a canary that
    crashed or lost its endpoints serves nothing, so the engine sees too few requests to judge
    while the gateway is answering 502/503 for it.
    """
    limit, rate, other = t.max_gateway_error_rate, _gateway_rate(canary), _gateway_rate(stable)
    if not gateway:
        return Check(GATEWAY_CHECK, None, None, limit, True, "gateway errors not checked: the operator runs without "
                     "--gateway-metrics (or --gateway-requests-query/--gateway-errors-query)")
    seen = canary.gateway_requests
    if rate is None or seen is None or seen < t.min_requests:
        return Check(GATEWAY_CHECK, rate, other, limit, None,
                     f"gateway ({gateway}) 5xx rate: too few canary requests at the gateway ({_fmt(seen)}, need "
                     f"{t.min_requests})")
    ok = rate <= limit
    return Check(GATEWAY_CHECK, rate, other, limit, ok,
                 f"gateway ({gateway}) 5xx rate canary {rate:.4g} ({canary.gateway_errors or 0:.0f} of {seen:.0f}) "
                 f"{'<=' if ok else '>'} {limit:g} (stable {_fmt(other)})")


def _camel_upper(name: str) -> str:
    return name[0].upper() + name[1:]


def checks_for(canary: Figures, stable: Figures, t: Thresholds, gateway: str = "") -> tuple[Check, ...]:
    """Every metric check, in a fixed order (the order a breach is reported in)."""
    limit: Callable[..., Check] = _limit_check
    return (
        limit("errorRate", "error rate", canary.error_rate, stable.error_rate, t.max_error_rate),
        _gateway_check(canary, stable, t, gateway),
        limit("restarts", "engine restarts", canary.restarts, stable.restarts, t.max_restarts),
        limit("oomEvents", "OOM events", canary.oom_events, stable.oom_events, t.max_restarts),
        _ratio_check("ttftP95Ratio", "P95 TTFT", canary.ttft_p95, stable.ttft_p95, t.max_ttft_p95_ratio),
        _ratio_check("tpotP95Ratio", "P95 TPOT", canary.tpot_p95, stable.tpot_p95, t.max_tpot_p95_ratio),
        limit("fallbackRate", "fallbacks per request", canary.fallbacks_per_request,
              stable.fallbacks_per_request, t.max_fallback_rate),
        _efficiency_check(canary, stable, t.min_kv_cache_efficiency),
        limit("preemptionRate", "preemptions per request", canary.preemptions_per_request,
              stable.preemptions_per_request, t.max_preemption_rate),
    )


# Events that count whatever the traffic: one OOM is one too many even in a quiet window.
VOLUME_INDEPENDENT = frozenset({"restarts", "oomEvents"})


def judge(canary: Figures, stable: Figures, thresholds: Thresholds, window_s: float, at: str,
          extra_checks: Sequence[Check] = (), gateway: str = "") -> AnalysisResult:
    """fail on a breached check; else inconclusive on too little traffic or a missing figure; else pass.

    A breach outranks missing data (an error rate over the limit fails even if TPOT had no samples).
    With too few requests on either track only restarts, OOM events, the gateway's 5xx rate (judged
    on its own request count) and `extra_checks` (the probe-set accuracy check, which does not
    depend on traffic) can fail: rates and ratios over a handful of requests are noise, so they
    make the analysis inconclusive instead. `gateway` names the gateway metrics (empty: none).
    """
    t = thresholds
    enough = (canary.requests is not None and stable.requests is not None
              and min(canary.requests, stable.requests) >= t.min_requests)
    volume_text = (f"requests in the {window_s:g} s window: canary {_fmt(canary.requests)}, "
                   f"stable {_fmt(stable.requests)}, need {t.min_requests} on each track")
    volume = Check("requests", canary.requests, stable.requests, t.min_requests, True if enough else None, volume_text)
    metric_checks = checks_for(canary, stable, t, gateway)
    decisive = [c for c in metric_checks if enough or c.name in VOLUME_INDEPENDENT
                or (c.name == GATEWAY_CHECK and c.ok is False)] + list(extra_checks)
    checks = (volume, *metric_checks, *extra_checks)
    failed = [c for c in decisive if c.ok is False]
    if failed:
        return AnalysisResult("fail", checks, f"{_camel_upper(failed[0].name)}Breached",
                              "; ".join(c.message for c in failed), window_s, at)
    if not enough:
        return AnalysisResult("inconclusive", checks, "TooFewRequests",
                              f"too few {volume_text}; not promoting", window_s, at)
    missing = [c for c in decisive if c.ok is None]
    if missing:
        return AnalysisResult("inconclusive", checks, "NoData",
                              "; ".join(c.message for c in missing) + "; not promoting", window_s, at)
    return AnalysisResult("pass", checks, "ChecksPassed",
                          f"all {len(decisive)} checks held over {window_s:g} s "
                          f"({canary.requests:.0f} canary / {stable.requests:.0f} stable requests)", window_s, at)


def inconclusive(reason: str, message: str, window_s: float, at: str) -> AnalysisResult:
    return AnalysisResult("inconclusive", (), reason, message, window_s, at)
