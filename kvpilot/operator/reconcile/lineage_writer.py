"""Read-modify-apply of the lineage ConfigMap, one writer at a time per InferenceService.

The stable reconcile and the rollout both write `<name>-lineage` (each its own track's entry)
with one server-side apply of the whole data, as the same field manager: an apply that was
computed from a read taken before the other writer's apply would drop that writer's key. The
lock makes each read-build-apply atomic within the operator (peering keeps one operator active).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kvpilot.operator.builders import build_lineage_configmap
from kvpilot.operator.builders.common import lineage_name
from kvpilot.operator.kube import Kube, object_path
from kvpilot.operator.spec import ServiceSpec
from kvpilot.planner import CapacityPlan

_locks: dict[tuple[str, str], threading.Lock] = {}
_guard = threading.Lock()


def _lock(namespace: str, name: str) -> threading.Lock:
    with _guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def apply_lineage(kube: Kube, owner: Mapping[str, Any], spec: ServiceSpec, plan: CapacityPlan,
                  track: str = "stable") -> dict[str, Any]:
    """Record `spec` as `track`'s current configuration (the old one becomes `previous` if it differs)."""
    namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    with _lock(namespace, name):
        live = kube.get(object_path("v1", "ConfigMap", namespace, lineage_name(name)))
        return kube.apply(build_lineage_configmap(owner, spec, plan, live, track=track))
