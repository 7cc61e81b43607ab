"""The rollout: the operator's steps and verdicts over the figures its analysis compares."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import statetimeline

import kvpilot.dashboards.queries as queries
from kvpilot import promql
from kvpilot.dashboards.common import (
    DATASOURCE,
    KV_EFFICIENCY_TARGET,
    OPERATOR_MATCHERS,
    RATE,
    Target,
    base,
    graph,
    per_track,
    prometheus_annotation,
    prometheus_query,
    to_dict,
)

UID = "kvpilot-rollout"
EVENT_WINDOW = "1m"  # annotation queries: a verdict marks the minute after it
VERDICT_COLOURS = (("pass", "green"), ("fail", "red"), ("inconclusive", "orange"))


def annotations() -> list[dict[str, Any]]:
    """Analysis verdicts, promotions and rollbacks as events on every panel."""
    m = OPERATOR_MATCHERS
    verdicts = [
        prometheus_annotation(f"Analysis: {verdict}", queries.verdict_events(m, verdict, EVENT_WINDOW), colour,
                              f"analysis {verdict}", "verdict")
        for verdict, colour in VERDICT_COLOURS
    ]
    return [
        *verdicts,
        prometheus_annotation("Promotions", queries.counter_events("kvpilot_rollout_promotions_total", m,
                              EVENT_WINDOW), "blue", "canary promoted", ""),
        prometheus_annotation("Rollbacks", queries.counter_events("kvpilot_rollout_rollbacks_total", m,
                              EVENT_WINDOW), "purple", "rolled back", ""),
    ]


def phase_timeline() -> statetimeline.Panel:
    return (
        statetimeline.Panel().title("Phase").description("The rollout phase the operator reports.")
        .datasource(DATASOURCE).span(12).height(6)
        .with_target(prometheus_query(Target(queries.current_phase(OPERATOR_MATCHERS), "{{phase}}")))
    )


def build() -> dict[str, Any]:
    m = OPERATOR_MATCHERS
    dashboard = (
        base(UID, "kvpilot / Rollout",
             "A canary rollout of one InferenceService: the canary weight and phase from the operator, stable "
             "against canary on every figure the analysis compares, and each verdict as an annotation.",
             multi_service=False)
        .with_row(db.Row("Operator"))
        .with_panel(graph(
            "Canary weight", "Share of requests the route sends to the canary (percent), and the step index "
            "(-1 when idle).", "short",
            [Target(f"max({promql.selector('kvpilot_rollout_weight', m)})", "weight %"),
             Target(f"max({promql.selector('kvpilot_rollout_step', m)})", "step")], min_value=-1))
        .with_panel(phase_timeline())
        .with_panel(graph(
            "Analyses by verdict", "Analyses the operator finished in the window.", "short",
            [Target(queries.analysis_verdicts(m, RATE), "{{verdict}}")], width=8, min_value=0))
        .with_panel(graph(
            "Accuracy delta", "Mean log-likelihood on the probe set, stable minus canary (higher: the canary "
            "is worse).", "short",
            [Target(f"max({promql.selector('kvpilot_rollout_accuracy_delta', m)})", "stable - canary")], width=8))
        .with_panel(graph(
            "Promotions and rollbacks", "In the window.", "short",
            [Target(f"sum(increase({promql.selector('kvpilot_rollout_promotions_total', m)}[{RATE}]))",
                    "promotions"),
             Target(f"sum by (reason) (increase({promql.selector('kvpilot_rollout_rollbacks_total', m)}[{RATE}]))",
                    "rollback: {{reason}}")], width=8, min_value=0))
        .with_row(db.Row("Stable against canary"))
        .with_panel(graph("Requests per second", "Requests each track ended: the real traffic split.", "reqps",
                          per_track(promql.request_rate, RATE), width=8, min_value=0))
        .with_panel(graph("Error rate", "Failed / (finished + failed).", "percentunit",
                          per_track(promql.error_rate, RATE), width=8, min_value=0))
        .with_panel(graph("KV cache efficiency", "Live / allocated token slots in the window.", "percentunit",
                          per_track(promql.kv_cache_efficiency_over, RATE), width=8, min_value=0, max_value=1,
                          good_from=KV_EFFICIENCY_TARGET))
        .with_panel(graph("Time to first token (P95)", "", "s", per_track(promql.ttft_p95, RATE), width=8,
                          min_value=0))
        .with_panel(graph("Time per output token (P95)", "", "s", per_track(promql.tpot_p95, RATE), width=8,
                          min_value=0))
        .with_panel(graph("End-to-end latency (P95)", "", "s", per_track(promql.e2e_p95, RATE), width=8,
                          min_value=0))
        .with_panel(graph("Fallbacks per request", "", "short", per_track(promql.fallbacks_per_request, RATE),
                          width=8, min_value=0))
        .with_panel(graph("Preemptions per request", "", "short",
                          per_track(promql.preemptions_per_request, RATE), width=8, min_value=0))
        .with_panel(graph("Engine restarts", "Restarts the sidecars saw in the window.", "short",
                          per_track(promql.restarts, RATE), width=8, min_value=0))
    )
    return to_dict(dashboard, annotations())
