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


def _camel_upper(name: str) -> str:
    return name[0].upper() + name[1:]


def checks_for(canary: Figures, stable: Figures, t: Thresholds) -> tuple[Check, ...]:
    """Every metric check, in a fixed order (the order a breach is reported in)."""
    limit: Callable[..., Check] = _limit_check
    return (
        limit("errorRate", "error rate", canary.error_rate, stable.error_rate, t.max_error_rate),
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
          extra_checks: Sequence[Check] = ()) -> AnalysisResult:
    """fail on a breached check; else inconclusive on too little traffic or a missing figure; else pass.

    A breach outranks missing data (an error rate over the limit fails even if TPOT had no samples).
    With too few requests on either track only restarts, OOM events and `extra_checks` (the
    probe-set accuracy check, which does not depend on traffic) can fail: rates and ratios over a
    handful of requests are noise, so they make the analysis inconclusive instead.
    """
    t = thresholds
    enough = (canary.requests is not None and stable.requests is not None
              and min(canary.requests, stable.requests) >= t.min_requests)
    volume_text = (f"requests in the {window_s:g} s window: canary {_fmt(canary.requests)}, "
                   f"stable {_fmt(stable.requests)}, need {t.min_requests} on each track")
    volume = Check("requests", canary.requests, stable.requests, t.min_requests, True if enough else None, volume_text)
    metric_checks = checks_for(canary, stable, t)
    decisive = [c for c in metric_checks if enough or c.name in VOLUME_INDEPENDENT] + list(extra_checks)
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
