"""The gray rollout of a canary: a pure state machine and the controller that drives it.

The machine (`phases`, `state`, `actions`, `machine`): (status, spec, analysis result, now) ->
(status, actions); no kopf, no I/O. The controller (`controller`: one tick; `observe`, `apply`,
`analysis_runner`, `gpu_check` with `gpu_capacity` and `replicas`, `route`, `locks`) observes an
InferenceService's world, calls `decide`, applies the returned actions through the Kube client,
the Router and the MetricProvider, and writes the returned status; it is kopf-free too, so tests
drive it against a real API server without kopf. This package exports the machine only.
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
