"""How many pods each track runs: the one place that decides it (stable, canary per step, promotion).

The canary is never silently the size of stable: `spec.canary.replicas` fixes it, otherwise each
step's weight sizes it, ceil(weight% x stable replicas) and at least 1, so a 1% canary of a
ten-replica service is one pod, not ten.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpilot.operator.spec import ServiceSpec

FULL = 100


@dataclass(frozen=True)
class CanarySize:
    """The canary's pods at one weight, and how that number was chosen (for status messages)."""

    replicas: int
    weight: int
    how: str  # "fixed by spec.canary.replicas" | "ceil(5% x 4 stable replicas), at least 1"


def stable_replicas(spec: ServiceSpec) -> int:
    """The stable track's pods: spec.replicas."""
    return spec.replicas


def canary_size(spec: ServiceSpec, weight: int) -> CanarySize:
    """The canary's pods while it carries `weight` percent of the traffic."""
    if spec.canary is not None and spec.canary.replicas is not None:
        return CanarySize(spec.canary.replicas, weight, "fixed by spec.canary.replicas")
    stable = stable_replicas(spec)
    return CanarySize(max(1, math.ceil(weight * stable / FULL)), weight,
                      f"ceil({weight}% x {stable} stable replicas), at least 1")


def canary_replicas(spec: ServiceSpec, weight: int) -> int:
    return canary_size(spec, weight).replicas


def step_weights(steps: tuple[int, ...]) -> tuple[int, ...]:
    """The weights the canary carries during analysis: the first step, and every step below 100
    (a pass before a 100 step promotes; only a first step of 100 is served as a step)."""
    return tuple(w for i, w in enumerate(steps) if i == 0 or w < FULL)


def peak_canary_size(spec: ServiceSpec) -> CanarySize:
    """The largest size the canary reaches during its steps (what the GPU preflight checks)."""
    steps = spec.canary.steps if spec.canary is not None else (FULL,)
    return max((canary_size(spec, w) for w in step_weights(steps)), key=lambda s: (s.replicas, s.weight))
