"""Phase and conditions of a track, read from its Deployment's status (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.operator.status.conditions import DEGRADED, PROGRESSING, READY, Condition

PENDING, PROGRESSING_PHASE, READY_PHASE, DEGRADED_PHASE, INFEASIBLE = (
    "Pending", "Progressing", "Ready", "Degraded", "Infeasible",
)


@dataclass(frozen=True)
class DeploymentState:
    """What the Deployment says: phase, replica counts and the three rollout conditions."""

    phase: str
    desired: int
    ready: int
    conditions: tuple[Condition, ...]


def deployment_state(deployment: Mapping[str, Any] | None) -> DeploymentState:
    """Ready when every replica is updated and available and the controller saw the latest spec."""
    if deployment is None:
        return DeploymentState(PENDING, 0, 0, (
            Condition(READY, "False", "NoDeployment", "the stable Deployment does not exist yet"),
            Condition(PROGRESSING, "True", "Creating", "creating the stable Deployment"),
            Condition(DEGRADED, "False", "NoDeployment", "no pods yet"),
        ))
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    name = deployment["metadata"]["name"]
    desired = int(spec.get("replicas", 1))
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    available = int(status.get("availableReplicas") or 0)
    total = int(status.get("replicas") or 0)
    seen = int(status.get("observedGeneration") or 0) >= int(deployment["metadata"].get("generation") or 0)
    dep_conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    stalled = dep_conditions.get("Progressing", {}).get("reason") == "ProgressDeadlineExceeded"
    failure = dep_conditions.get("ReplicaFailure", {})
    counts = f"{updated}/{desired} updated, {ready}/{desired} ready, {available}/{desired} available"
    if stalled or failure.get("status") == "True":
        why = failure.get("message") if failure.get("status") == "True" else dep_conditions["Progressing"].get("message")
        return DeploymentState(DEGRADED_PHASE, desired, ready, (
            Condition(READY, "True" if ready >= desired > 0 else "False", "RolloutStalled", counts),
            Condition(PROGRESSING, "False", "ProgressDeadlineExceeded" if stalled else "ReplicaFailure", counts),
            Condition(DEGRADED, "True", "RolloutStalled", f"Deployment {name}: {why}"),
        ))
    done = seen and updated == desired and available == desired and total == desired and ready == desired
    if done:
        return DeploymentState(READY_PHASE, desired, ready, (
            Condition(READY, "True", "AllReplicasReady", counts),
            Condition(PROGRESSING, "False", "RolloutComplete", f"Deployment {name} is up to date"),
            Condition(DEGRADED, "False", "AllReplicasReady", counts),
        ))
    return DeploymentState(PROGRESSING_PHASE, desired, ready, (
        Condition(READY, "True" if ready >= desired > 0 else "False",
                  "AllReplicasReady" if ready >= desired > 0 else "ReplicasNotReady", counts),
        Condition(PROGRESSING, "True", "RollingOut", f"Deployment {name}: {counts}"),
        Condition(DEGRADED, "False", "RollingOut", counts),
    ))
