"""What the state machine asks the controller to do; each is idempotent when applied twice."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SetWeight:
    """One route update: `weight` % of unpinned traffic to the canary, the rest to stable."""

    weight: int


@dataclass(frozen=True)
class ScaleCanary:
    """Apply the canary Deployment and Service with `replicas` pods (0 keeps the objects, no pods)."""

    replicas: int


@dataclass(frozen=True)
class DeleteCanary:
    """Delete the canary Deployment and Service (after a promotion, or when spec.canary goes)."""


@dataclass(frozen=True)
class RunAnalysis:
    """Judge canary against stable over the last `window_s` seconds; the result comes back in."""

    step: int
    weight: int
    window_s: float


@dataclass(frozen=True)
class Promote:
    """Make the canary's configuration the stable track's (old stable -> lineage `previous`)."""


@dataclass(frozen=True)
class RollbackStable:
    """Restore the stable track to lineage `previous` (a rollback after a promotion)."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the InferenceService: Normal|Warning, CamelCase reason, message."""

    type: str
    reason: str
    message: str


Action = SetWeight | ScaleCanary | DeleteCanary | RunAnalysis | Promote | RollbackStable | Event
