"""A Prometheus Operator PodMonitor for the sidecars (only where its CRD is installed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.builders.common import metadata


def _pod_label(label: str) -> str:
    """Prometheus' name for a pod label: every character outside [a-zA-Z0-9_] becomes `_`."""
    return "__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() else "_" for ch in label)


def relabelings() -> list[dict[str, Any]]:
    """The target labels every rollout query and dashboard selects on: namespace, service, track."""
    pairs = [("__meta_kubernetes_namespace", "namespace"), (_pod_label(c.LABEL_SERVICE), "service"),
             (_pod_label(c.LABEL_TRACK), "track"), (_pod_label(c.LABEL_STRATEGY), "strategy")]
    return [{"sourceLabels": [source], "targetLabel": target, "action": "replace"} for source, target in pairs]


def build_podmonitor(owner: Mapping[str, Any], interval: str = "15s") -> dict[str, Any]:
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata(owner, name, "metrics"),
        "spec": {
            "selector": {"matchLabels": {c.LABEL_SERVICE: name}},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": interval,
                                     "relabelings": relabelings()}],
        },
    }
