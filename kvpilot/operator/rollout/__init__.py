"""The canary rollout as a pure state machine: (status, spec, analysis result, now) -> (status, actions).

No kopf, no I/O: the controller (kvpilot.operator.rollout_controller) observes the world, calls
`decide`, applies the returned actions and writes the returned status.
"""

from kvpilot.operator.rollout.actions import (
    Action,
    DeleteCanary,
    Event,
    Promote,
    RollbackStable,
    RunAnalysis,
    ScaleCanary,
    SetWeight,
)
from kvpilot.operator.rollout.machine import Decision, decide
from kvpilot.operator.rollout.state import CanaryStatus, RolloutSpec, World

__all__ = [
    "Action",
    "CanaryStatus",
    "Decision",
    "DeleteCanary",
    "Event",
    "Promote",
    "RollbackStable",
    "RolloutSpec",
    "RunAnalysis",
    "ScaleCanary",
    "SetWeight",
    "World",
    "decide",
]
