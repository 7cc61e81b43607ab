"""PromQL for the rollout analysis, the dashboards and the demo: pure functions returning strings.

Every function takes a matcher string `m` (from `matchers()`, or a dashboard's own, e.g.
'namespace=~"$namespace"') and, where a rate is involved, a range such as "5m" or "$__rate_interval".
Counters that carry a label and may have no series yet (failed requests, fallbacks) are wrapped
in `or vector(0)`, so "no failure so far" reads as 0 while "no target at all" still reads as no
data (the finished-requests counter is always exported while the engine is up).
"""

from __future__ import annotations

P95 = 0.95


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def matchers(namespace: str, service: str, track: str | None = None) -> str:
    """'namespace="ns",service="svc"[,track="canary"]'; values verbatim, so "$namespace" works."""
    parts = [f'namespace="{_escape(namespace)}"', f'service="{_escape(service)}"']
    if track is not None:
        parts.append(f'track="{_escape(track)}"')
    return ",".join(parts)


def selector(metric: str, m: str) -> str:
    """`metric{m}`, or the bare name when there is no matcher (PromQL rejects `metric{}`)."""
    return f"{metric}{{{m}}}" if m else metric


def _sum_increase(metric: str, m: str, window: str) -> str:
    return f"sum(increase({selector(metric, m)}[{window}]))"


def _sum_rate(metric: str, m: str, window: str) -> str:
    return f"sum(rate({selector(metric, m)}[{window}]))"


def _zero_if_absent(expr: str) -> str:
    return f"({expr} or vector(0))"


def histogram_p95(metric: str, m: str, window: str) -> str:
    """P95 over all matching series of a `*_seconds` histogram (buckets summed across pods)."""
    return f"histogram_quantile({P95}, sum by (le) (rate({selector(metric + '_bucket', m)}[{window}])))"


def ttft_p95(m: str, window: str) -> str:
    return histogram_p95("kvpilot_ttft_seconds", m, window)


def tpot_p95(m: str, window: str) -> str:
    return histogram_p95("kvpilot_tpot_seconds", m, window)


def e2e_p95(m: str, window: str) -> str:
    return histogram_p95("kvpilot_e2e_latency_seconds", m, window)


def request_rate(m: str, window: str) -> str:
    """Requests ended per second (finished + failed)."""
    failed = _zero_if_absent(_sum_rate("kvpilot_requests_failed_total", m, window))
    return f"({_sum_rate('kvpilot_requests_finished_total', m, window)} + {failed})"


def requests_in_window(m: str, window: str) -> str:
    """Requests ended within the window (finished + failed)."""
    failed = _zero_if_absent(_sum_increase("kvpilot_requests_failed_total", m, window))
    return f"({_sum_increase('kvpilot_requests_finished_total', m, window)} + {failed})"


def error_rate(m: str, window: str) -> str:
    """failed / (finished + failed) over the window; NaN (no data) when nothing ended."""
    failed = _zero_if_absent(_sum_increase("kvpilot_requests_failed_total", m, window))
    return f"({failed} / {requests_in_window(m, window)})"


def kv_cache_efficiency(m: str) -> str:
    """Live token slots / allocated token slots, summed across pods first (so it aggregates right)."""
    return f"(sum({selector('kvpilot_kv_live_tokens', m)}) / sum({selector('kvpilot_kv_allocated_tokens', m)}))"


def kv_cache_efficiency_over(m: str, window: str) -> str:
    """The same ratio over a window, from the engines' token-slot-seconds counters.

    Every step counts, not only the instants Prometheus scraped: sampled gauges read 0/0 (no data)
    for a window whose scrapes all fell between short requests, which made a lightly loaded
    canary's analysis inconclusive although it had served enough requests. No data now means
    that no sequence held KV at all during the window.
    """
    live = _sum_increase("kvpilot_kv_live_token_seconds_total", m, window)
    allocated = _sum_increase("kvpilot_kv_allocated_token_seconds_total", m, window)
    return f"({live} / {allocated})"


def fallbacks_per_request(m: str, window: str) -> str:
    fallbacks = _zero_if_absent(_sum_increase("kvpilot_fallbacks_total", m, window))
    return f"({fallbacks} / {requests_in_window(m, window)})"


def preemptions_per_request(m: str, window: str) -> str:
    return f"({_sum_increase('kvpilot_preemptions_total', m, window)} / {requests_in_window(m, window)})"


def restarts(m: str, window: str) -> str:
    """Engine restarts seen by the sidecars within the window, summed across pods."""
    return _sum_increase("kvpilot_engine_restarts_total", m, window)


def oom_events(m: str, window: str) -> str:
    return _sum_increase("kvpilot_oom_events_total", m, window)


def engine_up(m: str) -> str:
    """Pods whose engine the sidecar could read at the last scrape."""
    return f"sum({selector('kvpilot_engine_up', m)})"
