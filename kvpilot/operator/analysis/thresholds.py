"""Analysis thresholds from `spec.canary.analysis`, with the defaults documented in docs/rollout.md.

| field | default | check (canary track unless said) |
|---|---|---|
| minRequests | 20 | requests ended in the window, on each track; fewer -> inconclusive |
| maxTtftP95Ratio | 1.5 | P95 time to first token, canary / stable |
| maxTpotP95Ratio | 1.5 | P95 time per output token, canary / stable |
| maxErrorRate | 0.01 | failed / (finished + failed) |
| maxGatewayErrorRate | 0.01 | 5xx the Gateway answered for the canary's Service / all it answered for it (with gateway metrics) |
| maxRestarts | 0 | engine restarts in the window; also the limit for OOM events |
| maxFallbackRate | 0.05 | runtime-validation fallbacks per request |
| minKvCacheEfficiency | 0.5 | live / allocated KV token slots over the window (all canary pods); 0 turns the check off |
| maxPreemptionRate | 0.1 | preemptions per request |
| maxAccuracyDelta | 0.05 | probe-set mean log-likelihood per token, stable - canary (nats; 0.05 ~ +5% perplexity) |
| probeSet | none | ConfigMap with the probes; none -> no accuracy gate |
| failureLimit | 2 | failed or inconclusive analyses before a rollback |
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """Limits for one analysis; field names are the CRD's in snake_case."""

    min_requests: int = 20
    max_ttft_p95_ratio: float = 1.5
    max_tpot_p95_ratio: float = 1.5
    max_error_rate: float = 0.01
    max_gateway_error_rate: float = 0.01
    max_restarts: int = 0
    max_fallback_rate: float = 0.05
    min_kv_cache_efficiency: float = 0.5
    max_preemption_rate: float = 0.1
    max_accuracy_delta: float = 0.05
    probe_set: str | None = None
    failure_limit: int = 2


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


SPEC_FIELDS = {_camel(f.name): f.name for f in fields(Thresholds)}  # minRequests -> min_requests, ...
RATIOS_0_1 = {"max_error_rate", "max_gateway_error_rate", "min_kv_cache_efficiency"}


def thresholds_from_spec(analysis: Mapping[str, Any] | None) -> Thresholds:
    """Thresholds from spec.canary.analysis; missing fields keep their defaults, wrong values are refused.

    Other keys (the CRD may carry more, e.g. the window) are not thresholds and are left alone.
    """
    analysis = analysis or {}
    values: dict[str, Any] = {}
    for key, name in SPEC_FIELDS.items():
        if key not in analysis or analysis[key] is None:
            continue
        values[name] = _checked(key, name, analysis[key])
    return Thresholds(**values)


def _checked(key: str, name: str, value: Any) -> Any:
    where = f"spec.canary.analysis.{key}"
    if name == "probe_set":
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where} must name a ConfigMap in the InferenceService's namespace, got {value!r}")
        return value
    if name in ("min_requests", "max_restarts", "failure_limit"):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "failure_limit" else 0):
            low = 1 if name == "failure_limit" else 0
            raise ValueError(f"{where} must be an integer >= {low}, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where} must be a finite number >= 0, got {value!r}")
    if name in RATIOS_0_1 and value > 1:
        raise ValueError(f"{where} is a ratio between 0 and 1, got {value!r}")
    return float(value)
