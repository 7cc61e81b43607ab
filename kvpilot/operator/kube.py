"""A small Kubernetes REST client: GET, server-side apply, status merge-patch; counts its requests."""

from __future__ import annotations

import json
import os
import signal
import ssl
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import httpx

from kvpilot.operator import constants as c

_KILL_AFTER_WRITES = int(os.environ.get("KVPILOT_TEST_SIGKILL_AFTER_WRITES") or 0)  # test-only; 0 = off

# Kinds this operator writes, and their plural resource names.
PLURALS = {"ConfigMap": "configmaps", "Deployment": "deployments", "Service": "services",
           "PodMonitor": "podmonitors", "HTTPRoute": "httproutes", "Gateway": "gateways", c.KIND: c.PLURAL}


class KubeError(RuntimeError):
    """The API server answered with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:400]}")
        self.status = status


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


class Kube:
    """One connection pool to the API server, shared by all handler threads."""

    def __init__(self, server: str, *, ca_file: str | None, cert: tuple[str, str] | None, token: str | None,
                 verify: bool = True) -> None:
        headers = {"Accept": "application/json", "User-Agent": "kvpilot-operator"}
        if token:
            headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
        tls: ssl.SSLContext | bool = False
        if verify or cert:
            tls = ssl.create_default_context(cafile=ca_file) if verify else ssl._create_unverified_context()
            if cert:
                tls.load_cert_chain(*cert)
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        self._http = httpx.Client(base_url=server, verify=tls, headers=headers, timeout=30.0, limits=limits)
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self._writes = 0
        self._crds: dict[str, tuple[float, bool]] = {}
        self.last_seen: dict[tuple[str, str], dict[str, Any]] = {}  # InferenceServices, for status_writer

    @classmethod
    def from_environment(cls, config_file: str | None = None) -> Kube:
        """`config_file`, else the in-cluster service account, else $KUBECONFIG or ~/.kube/config.

        $KUBECONFIG is read here, not when the kubernetes package was first imported (its default
        location is fixed at import time).
        """
        from kubernetes import client, config

        cfg = client.Configuration()
        if config_file:
            config.load_kube_config(config_file=config_file, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                        client_configuration=cfg)
        cert = (cfg.cert_file, cfg.key_file) if cfg.cert_file else None
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        return cls(cfg.host, ca_file=cfg.ssl_ca_cert, cert=cert, token=token, verify=bool(cfg.verify_ssl))

    def request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, str] | None = None,
                content_type: str = "application/json") -> dict[str, Any]:
        with self._lock:
            self.requests[method] += 1
        data = None if body is None else json.dumps(body)
        response = self._http.request(method, path, content=data, params=params,
                                      headers={"Content-Type": content_type})
        if response.status_code >= 400:
            raise KubeError(method, path, response.status_code, response.text)
        if _KILL_AFTER_WRITES and method != "GET":
            self._count_write_or_die()
        return response.json() if response.content else {}

    def _count_write_or_die(self) -> None:
        """Test-only fault (KVPILOT_TEST_SIGKILL_AFTER_WRITES=N): SIGKILL this process right after
        its N-th successful write, so a cluster test can stop a reconcile between two writes."""
        with self._lock:
            self._writes += 1
            if self._writes >= _KILL_AFTER_WRITES:
                os.kill(os.getpid(), signal.SIGKILL)

    def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply as field manager `kvpilot`, forcing ownership of the fields we set.

        An apply that changes nothing is a no-op on the server: no write, same resourceVersion.
        """
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        return self.request("PATCH", path, body=obj, params={"fieldManager": c.FIELD_MANAGER, "force": "true"},
                            content_type="application/apply-patch+yaml")

    def delete(self, path: str) -> bool:
        """Delete one object (children go with it, in the background); False when it was not there."""
        try:
            self.request("DELETE", path, body={"propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (annotations, spec fields) as field manager `kvpilot`."""
        return self.request("PATCH", path, body=patch, params={"fieldManager": c.FIELD_MANAGER},
                            content_type="application/merge-patch+json")

    def merge_patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        path = object_path(c.API_VERSION, c.KIND, namespace, name) + "/status"
        return self.request("PATCH", path, body=patch, params={"fieldManager": c.FIELD_MANAGER},
                            content_type="application/merge-patch+json")

    def crd_exists(self, name: str, max_age_s: float = 60.0) -> bool:
        """Whether a CRD is installed; remembered for `max_age_s` (one GET a minute, not per reconcile)."""
        cached = self._crds.get(name)
        if cached is not None and time.monotonic() - cached[0] < max_age_s:
            return cached[1]
        found = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") is not None
        self._crds[name] = (time.monotonic(), found)
        return found

    def close(self) -> None:
        self._http.close()


_shared: Kube | None = None
_shared_lock = threading.Lock()


def shared() -> Kube:
    """The process-wide client, created on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Kube.from_environment()
        return _shared
