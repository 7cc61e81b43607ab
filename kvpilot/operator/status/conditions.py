"""Status conditions as pure functions: set one, read one; transition time moves only on a flip."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

READY, CAPACITY_PLANNED, PROGRESSING, DEGRADED, MONITORING = (
    "Ready", "CapacityPlanned", "Progressing", "Degraded", "Monitoring",
)
PODS_BLOCKED = "PodsBlocked"  # a pod cannot run: the scheduler's or the kubelet's message (pod_blockers)
ORDER = (READY, CAPACITY_PLANNED, PROGRESSING, DEGRADED, PODS_BLOCKED, MONITORING)


@dataclass(frozen=True)
class Condition:
    """One condition as a decision: type, True/False/Unknown, a CamelCase reason, a message."""

    type: str
    status: str
    reason: str
    message: str


def set_conditions(current: Sequence[dict[str, Any]], updates: Sequence[Condition], *, now: str,
                   generation: int | None) -> list[dict[str, Any]]:
    """`current` with `updates` applied, sorted by ORDER; unchanged entries keep their times."""
    by_type = {c["type"]: dict(c) for c in current}
    for update in updates:
        old = by_type.get(update.type)
        new = {"type": update.type, "status": update.status, "reason": update.reason, "message": update.message}
        if generation is not None:
            new["observedGeneration"] = generation
        flipped = old is None or old.get("status") != update.status
        new["lastTransitionTime"] = now if flipped else old.get("lastTransitionTime", now)
        by_type[update.type] = new
    rank = {t: i for i, t in enumerate(ORDER)}
    return sorted(by_type.values(), key=lambda c: (rank.get(c["type"], len(ORDER)), c["type"]))


def get_condition(conditions: Sequence[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


def is_true(conditions: Sequence[dict[str, Any]] | None, type_: str) -> bool:
    found = get_condition(conditions, type_)
    return bool(found and found.get("status") == "True")
