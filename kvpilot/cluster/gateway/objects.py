"""Builders and look-ups for the objects a user of the local gateway writes (tests, the demo)."""

from __future__ import annotations

import time
from typing import Any

from kvpilot.cluster.api import ApiClient, ApiError
from kvpilot.cluster.gateway import GATEWAY_CLASS, GROUP


def gateway(namespace: str, name: str, port: int = 8080, allow_from: str = "All") -> dict[str, Any]:
    """A Gateway of the local class with one HTTP listener (`http`) on `port`."""
    return {"apiVersion": f"{GROUP}/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": namespace},
            "spec": {"gatewayClassName": GATEWAY_CLASS, "listeners": [
                {"name": "http", "protocol": "HTTP", "port": port,
                 "allowedRoutes": {"namespaces": {"from": allow_from}}}]}}


def gateway_url(api: ApiClient, namespace: str, name: str, timeout_s: float = 60.0) -> str:
    """`http://<address>:<port>` once the local gateway has programmed the Gateway."""
    path = f"/apis/{GROUP}/v1/namespaces/{namespace}/gateways/{name}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            gw = api.request("GET", path)
        except ApiError:
            gw = {}
        status = gw.get("status") or {}
        programmed = any(c.get("type") == "Programmed" and c.get("status") == "True"
                         for c in status.get("conditions") or [])
        if programmed and status.get("addresses"):
            port = gw["spec"]["listeners"][0]["port"]
            return f"http://{status['addresses'][0]['value']}:{port}"
        if time.monotonic() > deadline:
            raise TimeoutError(f"Gateway {namespace}/{name} was not programmed within {timeout_s:.0f} s; is the "
                               "local gateway running (`kvpilot cluster up` starts it; logs/kvpilot-gateway.log)?")
        time.sleep(0.2)


def route_conditions(route: dict[str, Any], controller: str) -> dict[str, dict[str, Any]]:
    """type -> condition of the status entry `controller` wrote for the route's first parent."""
    for parent in (route.get("status") or {}).get("parents") or []:
        if parent.get("controllerName") == controller:
            return {c["type"]: c for c in parent.get("conditions") or []}
    return {}
