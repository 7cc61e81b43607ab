"""Fleet overview: the mission metrics, memory, traffic and latency of every selected service."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db

import kvpilot.dashboards.queries as queries
from kvpilot import promql
from kvpilot.dashboards.common import (
    KV_EFFICIENCY_TARGET,
    RATE,
    SUMMARY_HIT_TARGET,
    TRACKS,
    Target,
    base,
    graph,
    matchers,
    per_track,
    to_dict,
)

UID = "kvpilot-fleet-overview"


def build() -> dict[str, Any]:
    m = matchers()
    dashboard = (
        base(UID, "kvpilot / Fleet overview",
             "KV-cache efficiency, summary-cache hit rate, memory by component, requests and latency of "
             "the selected services, stable and canary drawn apart.", multi_service=True)
        .with_row(db.Row("Mission metrics"))
        .with_panel(graph(
            "KV cache efficiency", "Token slots holding live K/V / token slots in blocks held by live "
            "sequences, every scrape in the window weighted by its allocation (target above 0.85).",
            "percentunit", per_track(promql.kv_cache_efficiency_over, RATE), width=8, min_value=0, max_value=1,
            good_from=KV_EFFICIENCY_TARGET))
        .with_panel(graph(
            "Summary cache hit rate", "Linear-attention steps whose recurrent state was resident / all such "
            "steps in the window (target above 0.995; no data where no linear-attention strategy runs).",
            "percentunit", [Target(queries.summary_cache_hit_rate(m, RATE), "{{track}}")], width=8, min_value=0, max_value=1,
            good_from=SUMMARY_HIT_TARGET))
        .with_panel(graph(
            "Engines up", "Pods whose engine the sidecar read at the last scrape.", "short",
            [Target(promql.engine_up(matchers(track)), track) for track in TRACKS],
            width=8, min_value=0))
        .with_row(db.Row("Memory"))
        .with_panel(graph(
            "Memory by component", "Summed over the selected pods. The components nest (kv used within kv "
            "pool, torch allocated within torch reserved), so they are lines, not a stack.", "bytes",
            [Target(queries.total(metric, m), name) for name, metric in queries.MEMORY_COMPONENTS],
            width=12, min_value=0))
        .with_panel(graph(
            "KV cache usage", "KV blocks held by live sequences / blocks in the pool.", "percentunit",
            [Target(f"{queries.total('kvpilot_kv_blocks_used', matchers(track))} / "
                    f"{queries.total('kvpilot_kv_blocks_capacity', matchers(track))}", track)
             for track in TRACKS], width=12, min_value=0, max_value=1))
        .with_row(db.Row("Requests"))
        .with_panel(graph(
            "Requests per second", "Requests that ended (finished + failed), per second.", "reqps",
            per_track(promql.request_rate, RATE), width=8, min_value=0))
        .with_panel(graph(
            "Error rate", "Failed / (finished + failed) requests in the window.", "percentunit",
            per_track(promql.error_rate, RATE), width=8, min_value=0))
        .with_panel(graph(
            "Running and waiting", "Requests in the running batch and in the queue.", "short",
            [Target(queries.total("kvpilot_requests_running", m), "running"),
             Target(queries.total("kvpilot_requests_waiting", m), "waiting")], width=8, min_value=0))
        .with_row(db.Row("Latency (P95)"))
        .with_panel(graph("Time to first token", "P95 over the window, buckets summed across pods.", "s",
                          per_track(promql.ttft_p95, RATE), width=8, min_value=0))
        .with_panel(graph("Time per output token", "P95 of the inter-token latency after the first.", "s",
                          per_track(promql.tpot_p95, RATE), width=8, min_value=0))
        .with_panel(graph("End-to-end latency", "P95 of the whole request.", "s",
                          per_track(promql.e2e_p95, RATE), width=8, min_value=0))
    )
    return to_dict(dashboard)
