"""Grafana dashboards as code: `python -m kvpilot.dashboards write dashboards/` regenerates the JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kvpilot.dashboards import fleet, memory, rollout

DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "fleet-overview.json": fleet.build,
    "service-memory.json": memory.build,
    "rollout.json": rollout.build,
}


def render(dashboard: dict[str, Any]) -> str:
    """The committed form of a dashboard: sorted keys, two-space indent, one trailing newline."""
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"
