"""Pure: the status documents the local gateway writes (Gateway API condition shape)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.cluster.gateway.plan import ParentStatus
from kvpilot.cluster.gateway.route_check import Condition


def conditions(conds: Sequence[Condition], generation: int, previous: Sequence[Mapping[str, Any]],
               now: str) -> list[dict[str, Any]]:
    """Condition dicts; `lastTransitionTime` moves only when a condition's status changes."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for c in conds:
        old = before.get(c.type, {})
        since = old.get("lastTransitionTime") if old.get("status") == c.status else None
        out.append({"type": c.type, "status": c.status, "reason": c.reason, "message": c.message[:32000],
                    "observedGeneration": generation, "lastTransitionTime": since or now})
    return out


def route_status(route: Mapping[str, Any], parents: Sequence[ParentStatus], controller: str,
                 now: str) -> dict[str, Any]:
    """`status.parents` with this controller's entries replaced and other controllers' kept."""
    generation = int(route["metadata"].get("generation", 0))
    current = (route.get("status") or {}).get("parents") or []
    others = [p for p in current if p.get("controllerName") != controller]
    mine_before = {_ref_key(p.get("parentRef", {})): p for p in current if p.get("controllerName") == controller}
    mine = [{"parentRef": p.parent_ref, "controllerName": controller,
             "conditions": conditions(p.conditions, generation,
                                      mine_before.get(_ref_key(p.parent_ref), {}).get("conditions") or [], now)}
            for p in parents]
    return {"parents": others + mine}


def gateway_status(gateway: Mapping[str, Any], address: str, gw_conds: Sequence[Condition],
                   listeners: Sequence[tuple[dict, int, list[Condition]]], now: str) -> dict[str, Any]:
    generation = int(gateway["metadata"].get("generation", 0))
    current = gateway.get("status") or {}
    before = {lst.get("name"): lst for lst in current.get("listeners") or []}
    return {
        "addresses": [{"type": "IPAddress", "value": address}],
        "conditions": conditions(gw_conds, generation, current.get("conditions") or [], now),
        "listeners": [{**head, "attachedRoutes": attached,
                       "conditions": conditions(conds, generation,
                                                before.get(head["name"], {}).get("conditions") or [], now)}
                      for head, attached, conds in listeners],
    }


def same(a: Any, b: Any) -> bool:
    """Equal up to lastTransitionTime (so an unchanged status is never rewritten)."""
    return _strip(a) == _strip(b)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "lastTransitionTime"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _ref_key(ref: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in ref.items()))
