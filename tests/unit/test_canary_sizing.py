"""The canary's size per step, its PDB, and the GPU preflight, through the rollout controller (in-memory API).

tests/cluster/test_operator_overrides.py runs the GPU preflight against a real API server.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
from operator_fakes import FakeKube, service

from kvpilot.operator import constants as c
from kvpilot.operator import options
from kvpilot.operator.context import Context
from kvpilot.operator.kube import KubeError, object_path
from kvpilot.operator.options import Options
from kvpilot.operator.reconcile.reconciler import reconcile
from kvpilot.operator.rollout import gpu_check
from kvpilot.operator.rollout.controller import tick
from kvpilot.operator.spec import GatewayRef
from tests.unit.rollout_fakes import Result, at

pytestmark = pytest.mark.unit
OPTIONS = Options(gateway=GatewayRef("gw", "infra"), prometheus_url="http://prometheus.invalid")
CRDS = ("httproutes.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io")


class ClusterKube(FakeKube):
    """FakeKube with GPU nodes and the pods bound to them; Deployments become ready at once."""

    def __init__(self, node_gpus: list[int], used: dict[str, int]) -> None:
        super().__init__(crds=CRDS)
        self.nodes = [{"metadata": {"name": f"n{i}", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
                       "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": str(g)},
                                              "conditions": [{"type": "Ready", "status": "True"}]}}
                      for i, g in enumerate(node_gpus)]
        self.used = used
        self.listed = 0
        self.canary_sizes: list[int] = []  # every canary Deployment size applied, in order

    def delete(self, path: str) -> bool:
        return self.objects.pop(path, None) is not None

    def request(self, method: str, path: str, *, body: Any = None, params: Any = None, **_: Any) -> dict[str, Any]:
        if method == "PATCH" and "/httproutes/" in path:
            return self.apply(body)
        if method == "GET" and path == "/api/v1/nodes":
            self.listed += 1
            return {"items": copy.deepcopy(self.nodes)}
        if method == "GET" and path == "/api/v1/pods":
            node = params["fieldSelector"].split(",")[0].removeprefix("spec.nodeName=")
            gpus = self.used.get(node, 0)
            return {"items": [{"spec": {"nodeName": node, "containers": [
                {"name": "x", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
                "status": {"phase": "Running"}}] if gpus else []}
        if method == "GET" and path.endswith("/pods"):
            return {"items": []}
        raise KubeError(method, path, 405, "not in the fake")

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        live = super().apply(obj)
        if obj["kind"] == "Deployment":
            if obj["metadata"]["name"] == "chat-canary":
                self.canary_sizes.append(obj["spec"]["replicas"])
            stored = self.objects[object_path("apps/v1", "Deployment", "ns", obj["metadata"]["name"])]
            n = obj["spec"]["replicas"]
            stored["status"] = {"observedGeneration": stored["metadata"]["generation"], "replicas": n,
                                "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}
            live = copy.deepcopy(stored)
        return live

    def canary_replicas(self) -> int | None:
        found = self.find("Deployment", "chat-canary", "apps/v1")
        return None if found is None else found["spec"]["replicas"]


@pytest.fixture(autouse=True)
def _fresh_checks() -> Any:
    gpu_check._last_refusal.clear()
    before = options.current()
    yield
    options.configure(before)


def rollout(kube: ClusterKube, **canary: Any) -> tuple[Any, list[tuple[str, str, str]]]:
    body = service(replicas=8, canary={"strategy": {"kvCacheDtype": "fp8"}, "interval": "10s", **canary})
    kube.add(body)
    events: list[tuple[str, str, str]] = []
    ctx = Context(kube=kube, emit=lambda *e: events.append(e), now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    reconcile(ctx, kube.get(object_path(c.API_VERSION, c.KIND, "ns", "chat")))
    clock = [0.0]

    def run(t: float) -> dict[str, Any]:
        clock[0] = t
        try:
            tick(ctx, "ns", "chat", OPTIONS, clock=lambda: at(clock[0]) + datetime.timedelta(0),
                 analyser=lambda *_: Result("pass"))
        except Exception as exc:  # ActionFailed: the handler retries; the test looks at what was written
            run.error = str(exc)  # type: ignore[attr-defined]
        return kube.get(object_path(c.API_VERSION, c.KIND, "ns", "chat"))["status"]

    return run, events


def condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(cond for cond in status["conditions"] if cond["type"] == gpu_check.CANARY_GPUS)


def test_the_canary_grows_with_the_weight_and_carries_promotion_at_stables_size() -> None:
    kube = ClusterKube([8, 8], used={"n0": 8})  # stable's 8 pods fill n0
    run, _events = rollout(kube, steps=[10, 50, 100])
    status = run(0)
    assert kube.canary_replicas() == 1 and status["canary"]["weight"] == 10  # ceil(10% x 8)
    cond = condition(status)
    assert cond["status"] == "True" and cond["reason"] == "GPUsAvailable"
    assert "4 pod(s) x 1 GPU = 4 nvidia.com/gpu at its largest step (50%" in cond["message"]
    assert "8 nvidia.com/gpu free on 2 matching node(s)" in cond["message"]
    assert kube.find("PodDisruptionBudget", "chat-canary", "policy/v1")["spec"]["maxUnavailable"] == 1
    assert kube.find("PodDisruptionBudget", "chat-stable", "policy/v1") is not None
    run(10)
    assert kube.canary_replicas() == 4  # ceil(50% x 8), before the route moved to 50%
    run(20)  # promotion: the canary keeps its 50% while stable rolls, so it needs no more pods
    assert kube.canary_sizes == [1, 4]
    assert kube.find("Deployment", "chat-canary", "apps/v1") is None  # promoted at once by the fake
    assert kube.find("PodDisruptionBudget", "chat-canary", "policy/v1") is None


def test_fixed_canary_replicas() -> None:
    kube = ClusterKube([8, 8], used={})
    run, _events = rollout(kube, steps=[1, 5, 100], replicas=3)
    run(0)
    assert kube.canary_replicas() == 3


def test_too_few_free_gpus_waits_before_the_canary_with_the_numbers() -> None:
    kube = ClusterKube([8, 8], used={"n0": 8, "n1": 7})
    run, events = rollout(kube, steps=[25, 100])  # ceil(25% x 8) = 2 pods, 1 GPU free
    status = run(0)
    assert kube.canary_replicas() is None and kube.find("Service", "chat-canary") is None
    cond = condition(status)
    assert cond["status"] == "False" and cond["reason"] == "InsufficientGPUs"
    assert "needs 2 pod(s) x 1 GPU = 2 nvidia.com/gpu" in cond["message"]
    assert "1 nvidia.com/gpu free on 2 matching node(s)" in cond["message"] and "16 allocatable" in cond["message"]
    assert ("Warning", "InsufficientGPUs") in [(e[0], e[1]) for e in events]
    assert status.get("canary", {}).get("phase", "Idle") == "Idle"  # the rollout has not started
    listed = kube.listed
    run(1)  # the handler retries soon; the refusal is remembered for RECHECK_S, no new listing
    assert kube.listed == listed and kube.canary_replicas() is None
    kube.used["n1"] = 0  # a job finished
    gpu_check._last_refusal.clear()  # RECHECK_S elapsed
    status = run(2)
    assert kube.canary_replicas() == 2 and condition(status)["status"] == "True"


def test_warn_mode_creates_the_canary_anyway() -> None:
    options.configure(Options(canary_gpu_check="warn"))
    kube = ClusterKube([8], used={"n0": 8})
    run, _events = rollout(kube, steps=[1, 100])
    status = run(0)
    assert kube.canary_replicas() == 1
    cond = condition(status)
    assert cond["status"] == "False" and "creating it anyway" in cond["message"]


def test_off_mode_lists_nothing() -> None:
    options.configure(Options(canary_gpu_check="off"))
    kube = ClusterKube([8], used={"n0": 8})
    run, _events = rollout(kube, steps=[1, 100])
    status = run(0)
    assert kube.canary_replicas() == 1 and kube.listed == 0
    assert all(cond["type"] != gpu_check.CANARY_GPUS for cond in status["conditions"])


def test_waiting_for_gpus_is_a_quiet_retry_not_a_handler_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    import kopf

    from kvpilot.operator.handlers import rollout_ticks as handler
    from kvpilot.operator.rollout.apply import ActionFailed

    body = {"metadata": {"namespace": "ns", "name": "chat"}}
    monkeypatch.setattr(handler, "context_for", lambda _body: None)

    def waiting(*_: Any, **__: Any) -> None:
        raise gpu_check.GpusUnavailable("the canary needs 2 GPUs; 1 free")

    monkeypatch.setattr(handler, "tick", waiting)
    assert handler.run_tick("rollout_timer", body, logging.getLogger("t")) is None  # type: ignore[arg-type]

    def failing(*_: Any, **__: Any) -> None:
        raise ActionFailed("the canary has no capacity plan")

    monkeypatch.setattr(handler, "tick", failing)
    with pytest.raises(kopf.TemporaryError):
        handler.run_tick("rollout_timer", body, logging.getLogger("t"))  # type: ignore[arg-type]
