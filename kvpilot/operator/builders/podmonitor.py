"""A Prometheus Operator PodMonitor for the sidecars (only where its CRD is installed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.builders.common import metadata


def build_podmonitor(owner: Mapping[str, Any], interval: str = "15s") -> dict[str, Any]:
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata(owner, name, "metrics"),
        "spec": {
            "selector": {"matchLabels": {c.LABEL_SERVICE: name}},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": interval}],
            "podTargetLabels": [c.LABEL_TRACK, c.LABEL_STRATEGY],
        },
    }
