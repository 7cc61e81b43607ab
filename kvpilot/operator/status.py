"""The InferenceService status document, built from decisions (pure; `now` is passed in)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpilot.operator.conditions import CAPACITY_PLANNED, READY, Condition, get_condition, set_conditions
from kvpilot.operator.pod_blockers import Blocker, blockers_condition
from kvpilot.operator.preflight import capacity_condition, capacity_status
from kvpilot.operator.rollout_state import INFEASIBLE, RolloutState
from kvpilot.operator.spec import ServiceSpec
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


def with_rollout(status: dict[str, Any], state: RolloutState, *, now: str) -> dict[str, Any]:
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
