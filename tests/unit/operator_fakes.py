"""Test doubles for the operator's unit tests: a sample InferenceService and an in-memory API."""

from __future__ import annotations

import copy
import json
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.context import Context
from kvpilot.operator.kube import KubeError, object_path
from kvpilot.operator.reconcile.reconciler import reconcile
from tests.helpers.model_configs import DEEPSEEK_V3, LLAMA3_8B  # noqa: F401 - re-exported to the operator tests

SHA = "ab" * 32


def service(name: str = "chat", *, config: dict | None = None, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": c.API_VERSION, "kind": c.KIND,
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1,
                     "resourceVersion": "1"},
        "spec": {
            "model": {"uri": "pvc://models/llama-3-8b", "sha256": SHA, "config": config or LLAMA3_8B},
            "strategy": {"attention": "gqa", "kvHeadGroups": 4, "kvCacheDtype": "int8", "maxSeqLen": 8192},
            "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H200"},
            "replicas": 2,
            "engine": {"image": "kvpilot:test", "disable": ["kv-quant"], "args": ["--log-level", "INFO"]},
        },
    }
    body["spec"].update(spec)
    return body


class FakeKube:
    """Objects by path; apply merges and bumps resourceVersion only when something changed."""

    def __init__(self, crds: tuple[str, ...] = ()) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.crds = set(crds)
        self.writes: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.last_seen: dict[tuple[str, str], dict[str, Any]] = {}
        self._rv = 100

    def add(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.objects[object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])] = copy.deepcopy(obj)

    def get(self, path: str) -> dict[str, Any] | None:
        self.requests.append(("GET", path))
        found = self.objects.get(path)
        return copy.deepcopy(found) if found else None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        self.requests.append(("APPLY", path))
        live = self.objects.get(path)
        desired = {k: v for k, v in copy.deepcopy(obj).items()}
        if live is not None:
            comparable = {k: v for k, v in live.items() if k != "status"}
            comparable["metadata"] = {k: v for k, v in live["metadata"].items()
                                      if k not in ("resourceVersion", "generation", "uid")}
            if json.dumps(comparable, sort_keys=True) == json.dumps(desired, sort_keys=True):
                return copy.deepcopy(live)
        self._rv += 1
        self.writes.append(path)
        generation = (live or {}).get("metadata", {}).get("generation", 0) + 1
        desired["metadata"] = {**desired["metadata"], "resourceVersion": str(self._rv), "generation": generation,
                               "uid": f"uid-{meta['name']}"}
        if live and "status" in live:
            desired["status"] = live["status"]
        self.objects[path] = desired
        return copy.deepcopy(desired)

    def merge_patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        path = object_path(c.API_VERSION, c.KIND, namespace, name)
        self.requests.append(("PATCH", path + "/status"))
        live = self.objects.get(path)
        if live is None:
            raise KubeError("PATCH", path, 404, "not found")
        if patch["metadata"]["resourceVersion"] != live["metadata"]["resourceVersion"]:
            raise KubeError("PATCH", path, 409, "conflict")
        status = dict(live.get("status") or {})
        for key, value in patch["status"].items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = copy.deepcopy(value)
        self._rv += 1
        live["status"] = status
        live["metadata"]["resourceVersion"] = str(self._rv)
        self.writes.append(path + "/status")
        return copy.deepcopy(live)

    def delete(self, path: str) -> bool:
        self.requests.append(("DELETE", path))
        return self.objects.pop(path, None) is not None

    def crd_exists(self, name: str) -> bool:
        self.requests.append(("GET", f"crd/{name}"))
        return name in self.crds

    def find(self, kind: str, name: str, api_version: str = "v1") -> dict[str, Any] | None:
        return self.objects.get(object_path(api_version, kind, "ns", name))


class Run:
    """One InferenceService reconciled against a FakeKube, its events kept."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube, self.events = kube, []
        self.ctx = Context(kube=kube, emit=lambda *e: self.events.append(e), now=lambda: "2026-01-01T00:00:00Z")

    def reconcile(self, body: dict):  # type: ignore[no-untyped-def]
        self.kube.add(body)
        live = self.kube.get(f"/apis/{c.API_VERSION}/namespaces/ns/{c.PLURAL}/{body['metadata']['name']}")
        return reconcile(self.ctx, live)

    def status(self, name: str = "chat") -> dict:
        return self.kube.find(c.KIND, name, c.API_VERSION)["status"]
