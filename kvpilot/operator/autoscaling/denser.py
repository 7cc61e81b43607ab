"""Strategy-aware scaling: before buying replicas for KV pressure, propose a denser KV strategy.

When the stable track's HPA has been held at maxReplicas on a KV signal (kvCacheUsage or
concurrency) for longer than the scale-down window, more pods would be the next purchase. A
denser KV cache may buy the same concurrency on the GPUs already paid for. The capacity planner
(the same function the preflight runs) sizes each candidate on this model and GPU; the proposal
is the candidate with the most concurrency per replica, tried in order of accuracy risk (an int8
KV cache first, then halving the KV heads by mean-pooled GQA, then an MLA latent at d/8, seed
000), and it is only ever started as a canary, so the accuracy gate judges it on the probe set.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec
from kvpilot.planner import CapacityPlan, ModelShape, PlannerError
from kvpilot.strategy_schema import CRD_KEYS, EIGHT_BIT_KV_DTYPES

KV_SIGNALS = ("kvCacheUsage", "concurrency")
MIN_GAIN = 1.2  # a candidate must raise the concurrency per replica by at least 20 % to be worth a canary


@dataclass(frozen=True)
class Candidate:
    """A strategy override (spec.canary.strategy fields, CRD names) and why it is denser."""

    strategy: dict[str, Any]
    why: str


@dataclass(frozen=True)
class Proposal:
    """The denser strategy, the planner's figures, and the replicas it stands in for."""

    strategy: dict[str, Any]
    why: str
    current_concurrency: int
    proposed_concurrency: int
    current_bytes_per_token: int
    proposed_bytes_per_token: int
    replicas: int  # replicas running now (at the HPA's maximum)

    @property
    def gain(self) -> float:
        return self.proposed_concurrency / self.current_concurrency

    @property
    def replicas_for_same_concurrency(self) -> int:
        return max(1, math.ceil(self.replicas / self.gain))

    def to_status(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy, "why": self.why,
            "maxConcurrency": {"current": self.current_concurrency, "proposed": self.proposed_concurrency},
            "bytesPerToken": {"current": self.current_bytes_per_token, "proposed": self.proposed_bytes_per_token},
            "gain": round(self.gain, 3),
            "replicas": {"now": self.replicas, "sameConcurrencyWith": self.replicas_for_same_concurrency},
            "message": (f"KV pressure at maxReplicas {self.replicas}: {self.why} would raise the plan's max "
                        f"concurrency per replica {self.current_concurrency} -> {self.proposed_concurrency} "
                        f"(x{self.gain:.2f}); the same concurrency on {self.replicas_for_same_concurrency} "
                        f"replica(s), if the accuracy gate passes it as a canary"),
        }


def candidates(spec: ServiceSpec, model_config: Mapping[str, Any]) -> list[Candidate]:
    """Denser strategies than the stable one, in order of accuracy risk."""
    strategy = spec.strategy
    shape = ModelShape.from_hf_config(model_config)
    out: list[Candidate] = []
    if strategy.kv_cache_dtype not in EIGHT_BIT_KV_DTYPES:
        out.append(Candidate({"kvCacheDtype": "int8"}, "an int8 KV cache (per-channel scales)"))
    kv_heads = strategy.kv_head_groups if strategy.attention == "gqa" and strategy.kv_head_groups else shape.num_kv_heads
    if strategy.attention in ("native", "gqa") and shape.mla is None and kv_heads and kv_heads % 2 == 0 and kv_heads > 1:
        out.append(Candidate({"attention": "gqa", "kvHeadGroups": kv_heads // 2},
                             f"mean-pooled GQA, {kv_heads} -> {kv_heads // 2} KV heads"))
    if strategy.attention in ("native", "gqa") and shape.mla is None:
        rank = max(16, shape.hidden_size // 8)
        out.append(Candidate({"attention": "mla", "latentRank": rank}, f"an MLA latent of rank {rank} (d/8)"))
    return out


def _with(spec: ServiceSpec, override: Mapping[str, Any]) -> ServiceSpec:
    return dataclasses.replace(spec, strategy=dataclasses.replace(
        spec.strategy, **{CRD_KEYS[k]: v for k, v in override.items()}))


def propose(spec: ServiceSpec, model_config: Mapping[str, Any], current: CapacityPlan, replicas: int) -> Proposal | None:
    """The first candidate, in risk order, whose plan is feasible and at least MIN_GAIN denser; else None."""
    if not current.feasible or current.max_concurrency <= 0:
        return None
    for candidate in candidates(spec, model_config):
        try:
            plan = preflight(_with(spec, candidate.strategy), model_config)
        except PlannerError:
            continue
        if plan.feasible and plan.max_concurrency >= MIN_GAIN * current.max_concurrency:
            return Proposal(candidate.strategy, candidate.why, current.max_concurrency, plan.max_concurrency,
                            current.bytes_per_token, plan.bytes_per_token, replicas)
    return None


def under_kv_pressure(hpa: Mapping[str, Any] | None, metric: str, max_replicas: int, now_s: float,
                      sustained_s: float) -> bool:
    """The stable HPA has been limited at maxReplicas on a KV signal for at least `sustained_s`."""
    if hpa is None or metric not in KV_SIGNALS:
        return False
    status = hpa.get("status") or {}
    if int(status.get("currentReplicas") or 0) < max_replicas:
        return False
    for condition in status.get("conditions") or ():
        if condition.get("type") == "ScalingLimited" and condition.get("status") == "True" \
                and condition.get("reason") == "TooManyReplicas":
            since = _seconds(condition.get("lastTransitionTime"))
            return since is not None and now_s - since >= sustained_s
    return False


def _seconds(stamp: Any) -> float | None:
    from datetime import datetime

    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
