"""The InferenceService status document, built from decisions (pure; `now` is passed in)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpilot.operator.spec import ServiceSpec
from kvpilot.operator.status.conditions import (
    CAPACITY_PLANNED,
    READY,
    Condition,
    get_condition,
    set_conditions,
)
from kvpilot.operator.status.deployment_state import INFEASIBLE, DeploymentState
from kvpilot.operator.status.pod_blockers import Blocker, blockers_condition
from kvpilot.planner import CapacityPlan


def with_conditions(status: dict[str, Any], updates: list[Condition], *, now: str,
                    generation: int | None) -> dict[str, Any]:
    conditions = set_conditions(status.get("conditions") or [], updates, now=now, generation=generation)
    return {**status, "conditions": conditions}


def with_plan(status: dict[str, Any], spec: ServiceSpec, plan: CapacityPlan, *, now: str,
              generation: int | None) -> dict[str, Any]:
    """The capacity figures, CapacityPlanned, the stable track's identity and observedGeneration."""
    updates = [capacity_condition(plan)]
    if not plan.feasible and get_condition(status.get("conditions"), READY) is None:
        updates.append(Condition(READY, "False", "CapacityInfeasible", "nothing was scheduled"))
    out = with_conditions(status, updates, now=now, generation=generation)
    out.update(
        observedGeneration=generation,
        strategy=plan.strategy,
        capacity=capacity_status(plan),
        stable={"modelUri": spec.model.uri, "sha256": spec.model.sha256, "strategy": plan.strategy},
    )
    if not plan.feasible:
        out["phase"] = INFEASIBLE
    return out


def with_deployment_state(status: dict[str, Any], state: DeploymentState, *, now: str) -> dict[str, Any]:
    """Ready/Progressing/Degraded and the replica counts; Infeasible wins over the rollout phase."""
    generation = status.get("observedGeneration")
    out = with_conditions(status, list(state.conditions), now=now, generation=generation)
    capacity = get_condition(out["conditions"], CAPACITY_PLANNED)
    infeasible = capacity is not None and capacity.get("status") == "False"
    out.update(
        phase=INFEASIBLE if infeasible else state.phase,
        readyReplicas=state.ready,
        replicas=state.desired,
        ready=f"{state.ready}/{state.desired}",
    )
    return out


def with_failure(status: dict[str, Any], condition: Condition, *, phase: str, now: str,
                 generation: int | None) -> dict[str, Any]:
    """A spec that cannot be planned, a model config that cannot be read, a child the API refused."""
    out = with_conditions(status, [condition], now=now, generation=generation)
    out.update(phase=phase, observedGeneration=generation)
    return out


def with_blockers(status: dict[str, Any], blockers: Sequence[Blocker], *, now: str) -> dict[str, Any]:
    """PodsBlocked and status.blockedPods (absent when nothing is blocked)."""
    out = with_conditions(status, [blockers_condition(blockers)], now=now,
                          generation=status.get("observedGeneration"))
    if blockers:
        out["blockedPods"] = [b.to_status() for b in blockers]
    else:
        out.pop("blockedPods", None)
    return out


def capacity_status(plan: CapacityPlan) -> dict[str, Any]:
    """status.capacity: the figures a user checks before and after a strategy change."""
    return {
        "strategy": plan.strategy,
        "gpuProduct": plan.gpu_product,
        "gpus": plan.gpus,
        "feasible": plan.feasible,
        "bytesPerToken": plan.bytes_per_token,
        "kvPoolBytes": plan.kv_pool_bytes,
        "numBlocks": plan.num_blocks,
        "perRequestPeakBytes": plan.per_request_peak_bytes,
        "maxSeqLen": plan.max_seq_len,
        "maxConcurrency": plan.max_concurrency,
        "weightsBytes": plan.weights_bytes,
        "freeBytes": plan.free_bytes,
    }


def capacity_condition(plan: CapacityPlan) -> Condition:
    if plan.feasible:
        return Condition(CAPACITY_PLANNED, "True", "Planned", plan.reason)
    return Condition(CAPACITY_PLANNED, "False", "Infeasible", plan.reason)
