"""PromQL only the dashboards draw (the rollout analysis and demo report share kvpilot/promql.py).

Same shape as promql.py: pure functions of a matcher string `m` and, for rates, a window.
"""

from __future__ import annotations

from kvpilot.promql import selector

MEMORY_COMPONENTS = (
    ("weights", "kvpilot_memory_weights_bytes"),
    ("kv pool", "kvpilot_memory_kv_pool_bytes"),
    ("kv used", "kvpilot_memory_kv_used_bytes"),
    ("activation peak", "kvpilot_memory_activation_peak_bytes"),
    ("torch reserved", "kvpilot_memory_torch_reserved_bytes"),
    ("torch allocated", "kvpilot_memory_torch_allocated_bytes"),
)  # they nest (kv used in kv pool, allocated in reserved): drawn as lines, never stacked

KV_BLOCKS = (
    ("capacity", "kvpilot_kv_blocks_capacity"),
    ("used", "kvpilot_kv_blocks_used"),
    ("cached", "kvpilot_kv_blocks_cached"),
    ("free", "kvpilot_kv_blocks_free"),
)


def total(metric: str, m: str) -> str:
    """A gauge summed over every matching pod."""
    return f"sum({selector(metric, m)})"


def rate(metric: str, m: str, window: str) -> str:
    """A counter's per-second rate summed over every matching pod."""
    return f"sum(rate({selector(metric, m)}[{window}]))"


def _increase_by_track(metric: str, m: str, window: str) -> str:
    return f"sum by (track) (increase({selector(metric, m)}[{window}]))"


def summary_cache_hit_rate(m: str, window: str) -> str:
    """Per track: linear-attention steps with a resident recurrent state / all such steps in the window.

    Grouped by track rather than drawn as one query per track: a track that runs no linear attention
    has no such steps (0/0), and the panel simply draws no line for it.
    """
    hits = _increase_by_track("kvpilot_summary_cache_hits_total", m, window)
    misses = _increase_by_track("kvpilot_summary_cache_misses_total", m, window)
    return f"({hits} / ({hits} + {misses}))"


def prefix_cache_hit_ratio(m: str, window: str) -> str:
    """Per track: prompt tokens found in the prefix cache / prompt tokens looked up, in the window
    (a strategy without prefix caching, such as linear attention, looks nothing up: no line)."""
    hits = _increase_by_track("kvpilot_prefix_cache_hit_tokens_total", m, window)
    queried = _increase_by_track("kvpilot_prefix_cache_queried_tokens_total", m, window)
    return f"({hits} / {queried})"


def head_utilization(m: str) -> str:
    """Per (layer, KV head): the sampled utilisation, averaged over the matching pods."""
    return f"avg by (layer, kv_head) ({selector('kvpilot_gqa_head_utilization', m)})"


def fallbacks_by_reason(m: str, window: str) -> str:
    return f"sum by (reason) (increase({selector('kvpilot_fallbacks_total', m)}[{window}]))"


def validation_cosine_min(m: str) -> str:
    """Per track, the lowest latest-check cosine among its pods (only strategies that validate have one)."""
    return f"min by (track) ({selector('kvpilot_validation_cosine', m)})"


def validation_checks_rate(m: str, window: str) -> str:
    return rate("kvpilot_validation_checks_total", m, window)


def analysis_verdicts(m: str, window: str) -> str:
    """Analyses the operator ran, by verdict, within the window (operator metrics carry no track)."""
    return f"sum by (verdict) (increase({selector('kvpilot_rollout_analysis_total', m)}[{window}]))"


def verdict_events(m: str, verdict: str, window: str) -> str:
    """Non-empty exactly where an analysis with this verdict finished (an annotation query)."""
    series = selector("kvpilot_rollout_analysis_total", f'{m},verdict="{verdict}"' if m else f'verdict="{verdict}"')
    return _moved(series, window)


def counter_events(metric: str, m: str, window: str) -> str:
    """Non-empty exactly where the counter moved (promotions, rollbacks: annotation queries)."""
    return _moved(selector(metric, m), window)


def _moved(series: str, window: str) -> str:
    """Steps where a counter changed, or where its series first appeared (a labelled counter created
    at its first increment starts at 1, which changes() and increase() do not see)."""
    return f"(sum(changes({series}[{window}])) > 0) or (sum({series} unless {series} offset {window}) > 0)"


def current_phase(m: str) -> str:
    """The phase whose gauge is 1 (a state timeline draws its label)."""
    return f"max by (phase) ({selector('kvpilot_rollout_phase', m)}) == 1"
