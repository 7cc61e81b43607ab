"""The lineage ConfigMap: per track, the current and previous model + SHA256 + engine flags.

A rollback is a pointer switch: `previous` is exactly what ran before, digests included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvpilot.operator.builders.common import lineage_name, metadata
from kvpilot.operator.builders.engine_args import engine_args, model_path
from kvpilot.operator.spec import ServiceSpec
from kvpilot.planner import CapacityPlan

TRACKS = ("stable", "canary")


def track_entry(spec: ServiceSpec, plan: CapacityPlan, served_name: str = "") -> dict[str, Any]:
    return {
        "uri": spec.model.uri,
        "path": model_path(spec.model.uri),
        "sha256": spec.model.sha256,
        "strategy": plan.strategy,
        "engineArgs": engine_args(spec, plan, served_name),
        # what a rollback restores: spec.model and spec.strategy as they were
        "spec": {"model": dict(spec.model_dict), "strategy": dict(spec.strategy_dict)},
    }


def read_lineage(live: Mapping[str, Any] | None) -> dict[str, dict[str, Any] | None]:
    """{track: {"current": entry, "previous": entry|None}} from a live ConfigMap (or empty)."""
    data = (live or {}).get("data") or {}
    out: dict[str, dict[str, Any] | None] = {}
    for track in TRACKS:
        raw = data.get(track)
        out[track] = json.loads(raw) if raw else None
    return out


def next_track_lineage(current: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
    """The new current; the old current becomes previous only when something actually changed."""
    if live is None:
        return {"current": current, "previous": None}
    if live.get("current") == current:
        return live
    return {"current": current, "previous": live.get("current")}


def build_lineage_configmap(owner: Mapping[str, Any], spec: ServiceSpec, plan: CapacityPlan,
                            live: Mapping[str, Any] | None, track: str = "stable") -> dict[str, Any]:
    """`<name>-lineage`, given the live ConfigMap (None on first reconcile): `track` gets `spec`.

    The other track's entry is kept as it is (one server-side apply owns both keys, and an apply
    that left one out would delete it).
    """
    lineage = read_lineage(live)
    lineage[track] = next_track_lineage(track_entry(spec, plan, owner["metadata"]["name"]), lineage[track])
    data = {t: json.dumps(lineage[t], sort_keys=True, indent=1) for t in TRACKS if lineage[t] is not None}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, lineage_name(owner["metadata"]["name"]), "lineage"),
        "data": data,
    }
