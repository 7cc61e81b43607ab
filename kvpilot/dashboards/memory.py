"""One service's memory: where the KV cache goes, how attention uses it, and what the guards did."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import heatmap as hm

import kvpilot.dashboards.queries as queries
from kvpilot import promql
from kvpilot.dashboards.common import (
    DATASOURCE,
    FALLBACK_COSINE,
    KV_EFFICIENCY_TARGET,
    RATE,
    SUMMARY_HIT_TARGET,
    Target,
    base,
    graph,
    matchers,
    per_track,
    prometheus_query,
    to_dict,
)

UID = "kvpilot-service-memory"


def head_utilisation_heatmap() -> heatmap.Panel:
    """One row per (layer, KV head), coloured by utilisation 0-1, over time (no bucketing: the rows are series)."""
    target = Target(queries.head_utilization(matchers()), "layer {{layer}} / kv head {{kv_head}}")
    return (
        heatmap.Panel().title("GQA head utilisation by layer and KV head")
        .description("exp(attention entropy) / context length, averaged over the query heads that share "
                     "the KV head and over the selected pods. Low rows: over-concentrated attention; an "
                     "uneven column: a hot spot.")
        .datasource(DATASOURCE).span(24).height(10).calculate(False)
        .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("RdYlGn")
               .scale(hm.HeatmapColorScale.LINEAR).min(0).max(1).steps(64))
        .rows_frame(heatmap.RowsHeatmapOptions().value("utilisation").layout(cm.HeatmapCellLayout.UNKNOWN))
        .y_axis(heatmap.YAxisConfig().axis_placement(cm.AxisPlacement.LEFT))
        .cell_values(heatmap.CellValues().unit("percentunit")).show_tooltip()
        .with_target(prometheus_query(target))
    )


def build() -> dict[str, Any]:
    m = matchers()
    dashboard = (
        base(UID, "kvpilot / Service memory",
             "One InferenceService's KV cache: memory by component, blocks, prefix-cache hits, attention "
             "head utilisation, preemptions, and the runtime validation that guards lossy strategies.",
             multi_service=False)
        .with_row(db.Row("Attention"))
        .with_panel(head_utilisation_heatmap())
        .with_row(db.Row("Memory and blocks"))
        .with_panel(graph(
            "Memory by component", "Summed over the selected pods; nested components, so lines.", "bytes",
            [Target(queries.total(metric, m), name) for name, metric in queries.MEMORY_COMPONENTS], min_value=0))
        .with_panel(graph(
            "KV blocks", "Blocks in the pool, held by live sequences, holding reusable prefix content, free.",
            "short", [Target(queries.total(metric, m), name) for name, metric in queries.KV_BLOCKS], min_value=0))
        .with_panel(graph(
            "KV cache efficiency", "Live token slots / allocated token slots in the window (target above 0.85).",
            "percentunit", per_track(promql.kv_cache_efficiency_over, RATE), min_value=0, max_value=1,
            good_from=KV_EFFICIENCY_TARGET))
        .with_panel(graph(
            "Prefix cache hits", "Prompt tokens found in the prefix cache / prompt tokens looked up.",
            "percentunit", [Target(queries.prefix_cache_hit_ratio(m, RATE), "{{track}}")], min_value=0, max_value=1))
        .with_row(db.Row("Pressure and guards"))
        .with_panel(graph(
            "Preemptions per request", "Sequences preempted to free KV blocks / requests ended.", "short",
            per_track(promql.preemptions_per_request, RATE), width=8, min_value=0))
        .with_panel(graph(
            "Fallbacks by reason", "Sequences sent to the exact attention path in the window, by reason.",
            "short", [Target(queries.fallbacks_by_reason(m, RATE), "{{reason}}")], width=8, min_value=0))
        .with_panel(graph(
            "Fallbacks per request", "Fallbacks / requests ended (the rollout gate's figure).", "short",
            per_track(promql.fallbacks_per_request, RATE), width=8, min_value=0))
        .with_panel(graph(
            "Validation cosine", "Cosine of the latest exact-vs-approximate check, lowest pod; below 0.92 the "
            "sequence falls back to exact attention.", "short",
            [Target(queries.validation_cosine_min(m), "{{track}}")],
            min_value=-1, max_value=1, good_from=FALLBACK_COSINE))
        .with_panel(graph(
            "Validation checks per second", "Exact-vs-approximate attention comparisons run.", "ops",
            per_track(queries.validation_checks_rate, RATE), min_value=0))
        .with_panel(graph(
            "Summary cache hit rate", "Linear-attention steps with a resident recurrent state (target above "
            "0.995).", "percentunit", [Target(queries.summary_cache_hit_rate(m, RATE), "{{track}}")], min_value=0, max_value=1,
            good_from=SUMMARY_HIT_TARGET))
        .with_panel(graph(
            "OOM events and restarts", "Out-of-memory events the engines caught and engine restarts the "
            "sidecars saw, in the window.", "short",
            [Target(promql.oom_events(m, RATE), "oom events"), Target(promql.restarts(m, RATE), "restarts")],
            min_value=0))
    )
    return to_dict(dashboard)
