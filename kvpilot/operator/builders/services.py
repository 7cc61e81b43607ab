"""Services: the engine API (stable track) and the sidecars' metrics (every track)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.builders.common import metadata, metrics_service_name


def build_api_service(owner: Mapping[str, Any]) -> dict[str, Any]:
    """`<name>`: OpenAI-compatible API on port 8000 of the stable pods."""
    name = owner["metadata"]["name"]
    return _service(owner, name, "api", {c.LABEL_SERVICE: name, c.LABEL_TRACK: "stable"},
                    {"name": "http", "port": c.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"})


def build_track_service(owner: Mapping[str, Any], track: str = "canary") -> dict[str, Any]:
    """`<name>-<track>`: the engine API of one track's pods (the route's canary backend)."""
    name = owner["metadata"]["name"]
    return _service(owner, f"{name}-{track}", "api", {c.LABEL_SERVICE: name, c.LABEL_TRACK: track},
                    {"name": "http", "port": c.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"})


def build_metrics_service(owner: Mapping[str, Any]) -> dict[str, Any]:
    """`<name>-metrics`: the sidecars' /metrics on port 9400 of every track's pods.

    Headless: Prometheus scrapes each pod, never a load-balanced address, and no cluster IP is
    spent on it.
    """
    name = owner["metadata"]["name"]
    return _service(owner, metrics_service_name(name), "metrics", {c.LABEL_SERVICE: name},
                    {"name": "metrics", "port": c.METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
                    headless=True)


def _service(owner: Mapping[str, Any], name: str, component: str, selector: dict[str, str],
             port: dict[str, Any], headless: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "ClusterIP", "selector": selector, "ports": [port]}
    if headless:
        spec["clusterIP"] = "None"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, component),
        "spec": spec,
    }
