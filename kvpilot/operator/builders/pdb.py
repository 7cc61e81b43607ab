"""The PodDisruptionBudget of one track: a node drain evicts at most maxUnavailable engines at once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.builders.common import deployment_name, metadata
from kvpilot.operator.spec import ServiceSpec


def pdb_name(service: str, track: str = "stable") -> str:
    return deployment_name(service, track)


def build_pdb(owner: Mapping[str, Any], spec: ServiceSpec, track: str = "stable") -> dict[str, Any]:
    """`<name>-<track>`, selecting that track's pods; maxUnavailable 1 unless spec.disruptionBudget says.

    maxUnavailable (not minAvailable) by default: with one replica a drain can still proceed (the
    pod is recreated elsewhere), while a fleet never loses more than one engine to evictions at a
    time. Unhealthy pods (still loading, crash-looping) may always be evicted, so a broken pod
    never blocks a drain.
    """
    name = owner["metadata"]["name"]
    budget = spec.disruption_budget
    limit = ({"minAvailable": budget.min_available} if budget.min_available is not None
             else {"maxUnavailable": budget.max_unavailable if budget.max_unavailable is not None else 1})
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner, pdb_name(name, track), "engine", track),
        "spec": {
            **limit,
            "selector": {"matchLabels": {c.LABEL_SERVICE: name, c.LABEL_TRACK: track}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
