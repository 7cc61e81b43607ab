"""The few Kubernetes API calls `LocalCluster` needs, over urllib (no client library at start-up)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any


class ApiError(RuntimeError):
    """A Kubernetes API call answered with an HTTP error."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:500]}")
        self.status = status


class ApiClient:
    """JSON requests against one apiserver with a client-certificate TLS context."""

    def __init__(self, server: str, tls: ssl.SSLContext) -> None:
        self.server, self.tls = server, tls

    def request(self, method: str, path: str, body: dict | None = None,
                content_type: str = "application/json") -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.tls) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise ApiError(method, path, exc.code, exc.read().decode(errors="replace")) from None

    def exists(self, path: str) -> bool:
        try:
            self.request("GET", path)
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise

    def create_node(self, node: dict) -> None:
        """Create the node with its status; if the apiserver dropped the status, patch it in."""
        name = node["metadata"]["name"]
        created = self.request("POST", "/api/v1/nodes", node)
        if (created.get("status") or {}).get("allocatable") != node["status"]["allocatable"]:
            self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": node["status"]},
                         content_type="application/merge-patch+json")

    def node_ready(self, name: str) -> bool:
        try:
            node = self.request("GET", f"/api/v1/nodes/{name}")
        except (ApiError, OSError):
            return False
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
