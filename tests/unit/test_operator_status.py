"""Conditions and the phase read from a Deployment's status (pure functions)."""

from __future__ import annotations

import pytest

from kvpilot.operator.status.conditions import Condition, get_condition, set_conditions
from kvpilot.operator.status.deployment_state import deployment_state

pytestmark = pytest.mark.unit


def deployment(generation: int = 1, **status: object) -> dict:
    return {"metadata": {"name": "chat-stable", "generation": generation}, "spec": {"replicas": 2},
            "status": status}


def test_transition_time_moves_only_when_status_flips() -> None:
    first = set_conditions([], [Condition("Ready", "False", "X", "m")], now="t1", generation=1)
    same = set_conditions(first, [Condition("Ready", "False", "Y", "m2")], now="t2", generation=2)
    flipped = set_conditions(same, [Condition("Ready", "True", "Z", "m3")], now="t3", generation=2)
    assert get_condition(same, "Ready")["lastTransitionTime"] == "t1"
    assert get_condition(same, "Ready")["reason"] == "Y"
    assert get_condition(flipped, "Ready")["lastTransitionTime"] == "t3"


def test_conditions_keep_a_stable_order() -> None:
    out = set_conditions([], [Condition(t, "True", "R", "") for t in ("Degraded", "Ready", "CapacityPlanned")],
                         now="t", generation=1)
    assert [c["type"] for c in out] == ["Ready", "CapacityPlanned", "Degraded"]


def test_rollout_phases() -> None:
    assert deployment_state(None).phase == "Pending"
    assert deployment_state(deployment(observedGeneration=1, replicas=2, updatedReplicas=2, readyReplicas=2,
                                    availableReplicas=2)).phase == "Ready"
    # controller has not seen generation 2 yet
    assert deployment_state(deployment(2, observedGeneration=1, replicas=2, updatedReplicas=2, readyReplicas=2,
                                    availableReplicas=2)).phase == "Progressing"
    # surge pod still around
    mid = deployment_state(deployment(observedGeneration=1, replicas=3, updatedReplicas=1, readyReplicas=2,
                                   availableReplicas=2))
    assert mid.phase == "Progressing"
    assert {c.type: c.status for c in mid.conditions} == {"Ready": "True", "Progressing": "True", "Degraded": "False"}
    stalled = deployment_state(deployment(observedGeneration=1, replicas=2, updatedReplicas=1, readyReplicas=1,
                                       conditions=[{"type": "Progressing", "status": "False",
                                                    "reason": "ProgressDeadlineExceeded", "message": "too slow"}]))
    assert stalled.phase == "Degraded"
    assert {c.type: c.status for c in stalled.conditions}["Degraded"] == "True"
