"""A small Kubernetes REST client: GET, server-side apply, status merge-patch; counts its requests.

A bearer token read from a file (the in-cluster service account's, or a kubeconfig `tokenFile`)
is read again when the file changes, at least every minute, and at once when the API server
answers 401: bound service-account tokens expire (about an hour) and the kubelet rewrites the
file before they do, so a long-running operator must never keep the first token it read.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import threading
import time
from collections import Counter
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import httpx

from kvpilot.operator import constants as c

_KILL_AFTER_WRITES = int(os.environ.get("KVPILOT_TEST_SIGKILL_AFTER_WRITES") or 0)  # test-only; 0 = off

# Kinds this operator writes, and their plural resource names.
PLURALS = {"ConfigMap": "configmaps", "Deployment": "deployments", "Service": "services",
           "PodMonitor": "podmonitors", "HTTPRoute": "httproutes", "Gateway": "gateways",
           "PodDisruptionBudget": "poddisruptionbudgets", "HorizontalPodAutoscaler": "horizontalpodautoscalers",
           c.KIND: c.PLURAL}
TOKEN_REFRESH_S = 60.0  # as client-go and the kubernetes package: re-read the token file at least this often


class KubeError(RuntimeError):
    """The API server answered with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:400]}")
        self.status = status


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


class TokenFile(httpx.Auth):
    """A bearer token that follows its file: re-read when the file changes, every TOKEN_REFRESH_S, and
    once more (then the request is retried) when the API server answers 401 Unauthorized."""

    def __init__(self, path: str | os.PathLike[str], refresh_s: float = TOKEN_REFRESH_S) -> None:
        self.path = Path(path)
        self.refresh_s = refresh_s
        self.reads = 0
        self._lock = threading.Lock()
        self._token = ""
        self._stamp: tuple[int, int, int] | None = None
        self._read_at = 0.0
        self.token()  # a missing or empty file fails at start, not at the first request

    def token(self, *, force: bool = False) -> str:
        with self._lock:
            stat = self.path.stat()
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # the kubelet swaps a symlink: new inode
            if force or stamp != self._stamp or time.monotonic() - self._read_at >= self.refresh_s:
                text = self.path.read_text().strip()
                if not text:
                    raise ValueError(f"service-account token file {self.path} is empty")
                self._token, self._stamp, self._read_at = text, stamp, time.monotonic()
                self.reads += 1
            return self._token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        sent = self.token()
        request.headers["Authorization"] = f"Bearer {sent}"
        response = yield request
        if response.status_code == 401 and self.token(force=True) != sent:
            request.headers["Authorization"] = f"Bearer {self._token}"
            yield request


class Kube:
    """One connection pool to the API server, shared by all handler threads."""

    def __init__(self, server: str, *, ca_file: str | None, cert: tuple[str, str] | None, token: str | None,
                 verify: bool = True, token_file: str | os.PathLike[str] | None = None) -> None:
        headers = {"Accept": "application/json", "User-Agent": "kvpilot-operator"}
        auth = TokenFile(token_file) if token_file else None
        if token and auth is None:  # a literal token (kubeconfig `token`): nothing to re-read
            headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
        tls: ssl.SSLContext | bool = False
        if verify or cert:
            tls = ssl.create_default_context(cafile=ca_file) if verify else ssl._create_unverified_context()
            if cert:
                tls.load_cert_chain(*cert)
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        self.token_file = auth
        self._http = httpx.Client(base_url=server, verify=tls, headers=headers, timeout=30.0, limits=limits,
                                  auth=auth)
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self._writes = 0
        self._crds: dict[str, tuple[float, bool]] = {}
        self.last_seen: dict[tuple[str, str], dict[str, Any]] = {}  # InferenceServices, for status/writer.py

    @classmethod
    def from_environment(cls, config_file: str | None = None) -> Kube:
        """`config_file`, else the in-cluster service account, else $KUBECONFIG or ~/.kube/config.

        $KUBECONFIG is read here, not when the kubernetes package was first imported (its default
        location is fixed at import time).
        """
        from kubernetes import client, config
        from kubernetes.config.incluster_config import SERVICE_TOKEN_FILENAME

        cfg = client.Configuration()
        token_file: str | None = None
        if not config_file:
            try:
                config.load_incluster_config(client_configuration=cfg)
                token_file = SERVICE_TOKEN_FILENAME
            except config.ConfigException:
                config_file = os.environ.get("KUBECONFIG") or None
        if token_file is None:
            config.load_kube_config(config_file=config_file, client_configuration=cfg)
            token_file = kubeconfig_token_file(config_file)
        cert = (cfg.cert_file, cfg.key_file) if cfg.cert_file else None
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        return cls(cfg.host, ca_file=cfg.ssl_ca_cert, cert=cert, token=token, verify=bool(cfg.verify_ssl),
                   token_file=token_file)

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


def kubeconfig_token_file(config_file: str | None) -> str | None:
    """The current context's user's `tokenFile` (the kubernetes package reads it once), else None."""
    import yaml

    path = Path(os.path.expanduser(config_file or "~/.kube/config"))
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    contexts = {ctx.get("name"): ctx.get("context") or {} for ctx in doc.get("contexts") or ()}
    user = contexts.get(doc.get("current-context"), {}).get("user")
    for entry in doc.get("users") or ():
        if entry.get("name") == user and (entry.get("user") or {}).get("tokenFile"):
            found = Path(os.path.expanduser(entry["user"]["tokenFile"]))
            return str(found if found.is_absolute() else path.parent / found)
    return None


_shared: Kube | None = None
_shared_lock = threading.Lock()


def shared() -> Kube:
    """The process-wide client, created on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Kube.from_environment()
        return _shared
