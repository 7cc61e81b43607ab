"""The operator's own /metrics (prometheus-client): rollout phase, weight, step, verdicts, reconciles."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from kvpilot.operator.rollout.phases import ALL as PHASES

WEIGHT = Gauge("kvpilot_rollout_weight", "Share of unpinned traffic routed to the canary, percent",
               ["namespace", "service"])
STEP = Gauge("kvpilot_rollout_step", "Index of the current canary step (-1 when no rollout runs)",
             ["namespace", "service"])
PHASE = Gauge("kvpilot_rollout_phase", "1 for the rollout's current phase, 0 for the others",
              ["namespace", "service", "phase"])
ANALYSES = Counter("kvpilot_rollout_analysis_total", "Canary analyses by verdict",
                   ["namespace", "service", "verdict"])
ANALYSIS_SECONDS = Histogram("kvpilot_rollout_analysis_duration_seconds", "Time one canary analysis took",
                             buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
ACCURACY_DELTA = Gauge("kvpilot_rollout_accuracy_delta",
                       "Probe-set mean log-likelihood per token, stable - canary (last analysis)",
                       ["namespace", "service"])
PROMOTIONS = Counter("kvpilot_rollout_promotions_total", "Canaries promoted to stable", ["namespace", "service"])
ROLLBACKS = Counter("kvpilot_rollout_rollbacks_total", "Rollbacks by reason", ["namespace", "service", "reason"])
RECONCILES = Counter("kvpilot_operator_reconcile_total", "Handler runs", ["handler"])
RECONCILE_ERRORS = Counter("kvpilot_operator_reconcile_errors_total", "Handler runs that raised", ["handler"])


def record_status(namespace: str, service: str, phase: str, step: int, weight: int) -> None:
    WEIGHT.labels(namespace, service).set(weight)
    STEP.labels(namespace, service).set(step)
    for name in PHASES:
        PHASE.labels(namespace, service, name).set(1 if name == phase else 0)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a background thread."""
    start_http_server(port, addr=addr)
