"""The rollout controller end to end against the in-memory API: actions reach the objects.

The cluster tier runs the same path against a real API server, Prometheus and engines; this one
checks the wiring quickly (which object each action writes, what the status says).
"""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from kvpilot.operator import constants as c
from kvpilot.operator.canary.controller import tick
from kvpilot.operator.kube import KubeError, object_path
from kvpilot.operator.options import Options
from kvpilot.operator.reconciler import Context, reconcile
from kvpilot.operator.rollout import RunAnalysis
from kvpilot.operator.spec import GatewayRef
from tests.unit.operator_fakes import FakeKube, service
from tests.unit.rollout_fakes import Result, at

pytestmark = pytest.mark.unit
GATEWAY_CRDS = ("httproutes.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io")
OPTIONS = Options(gateway=GatewayRef("gw", "infra"), prometheus_url="http://prometheus.invalid")
CANARY = {"strategy": {"kvCacheDtype": "fp8"}, "steps": [1, 5, 100], "interval": "10s",
          "analysis": {"failureLimit": 2}}


class RolloutKube(FakeKube):
    """FakeKube plus DELETE and the router's raw server-side apply; Deployments become ready at once."""

    def delete(self, path: str) -> bool:
        self.requests.append(("DELETE", path))
        return self.objects.pop(path, None) is not None

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "PATCH" and "/httproutes/" in path:
            return self.apply(body)
        raise KubeError(method, path, 405, "not in the fake")

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        live = super().apply(obj)
        if obj["kind"] == "Deployment":  # the controller-manager and kubelets, instantly
            stored = self.objects[object_path("apps/v1", "Deployment", "ns", obj["metadata"]["name"])]
            n = obj["spec"]["replicas"]
            stored["status"] = {"observedGeneration": stored["metadata"]["generation"], "replicas": n,
                                "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}
            live = copy.deepcopy(stored)
        return live

    def route_weight(self) -> int:
        route = self.objects["/apis/gateway.networking.k8s.io/v1/namespaces/ns/httproutes/chat"]
        weighted = route["spec"]["rules"][-1]["backendRefs"]
        return weighted[1]["weight"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> datetime.datetime:
        return at(self.t)


def setup(verdicts: list[str], **canary: Any) -> tuple[RolloutKube, Context, Clock, list[RunAnalysis], Any]:
    kube = RolloutKube(crds=GATEWAY_CRDS)
    body = service(canary={**CANARY, **canary})
    kube.add(body)
    ctx = Context(kube=kube, emit=lambda *e: events.append(e), now=lambda: "2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    events: list[tuple[str, str, str]] = []
    reconcile(ctx, kube.get(object_path(c.API_VERSION, c.KIND, "ns", "chat")))
    clock, asked = Clock(), []

    def analyser(_body: Any, request: RunAnalysis, _now: datetime.datetime) -> Result:
        asked.append(request)
        return Result(verdicts.pop(0))

    def run() -> dict[str, Any]:
        tick(ctx, "ns", "chat", OPTIONS, clock=clock, analyser=analyser)
        return kube.get(object_path(c.API_VERSION, c.KIND, "ns", "chat"))["status"]

    run.events = events  # type: ignore[attr-defined]
    return kube, ctx, clock, asked, run


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"namespace": "ns", "service": "chat", **labels}) or 0.0


def test_healthy_canary_walks_the_steps_and_promotes() -> None:
    promotions = sample("kvpilot_rollout_promotions_total")
    kube, _ctx, clock, asked, run = setup(["pass", "pass"])
    status = run()
    assert status["canary"]["phase"] == "Progressing" and status["canary"]["weight"] == 1
    assert kube.route_weight() == 1
    assert kube.find("Service", "chat-canary") is not None
    assert "fp8" in kube.find("Deployment", "chat-canary", "apps/v1")["spec"]["template"]["metadata"]["labels"][
        "kvpilot.io/strategy"]
    clock.t = 5
    assert run()["canary"]["weight"] == 1 and asked == []
    clock.t = 10
    status = run()
    assert [a.step for a in asked] == [0] and status["canary"]["weight"] == 5 and kube.route_weight() == 5
    clock.t = 20
    status = run()
    assert status["canary"]["phase"] == "Promoted" and kube.route_weight() == 0
    assert kube.find("Deployment", "chat-canary", "apps/v1") is None
    stable = kube.find("Deployment", "chat-stable", "apps/v1")
    assert "fp8" in stable["spec"]["template"]["metadata"]["labels"]["kvpilot.io/strategy"]
    lineage = {k: json.loads(v) for k, v in kube.find("ConfigMap", "chat-lineage")["data"].items()}
    assert lineage["stable"]["previous"]["spec"]["strategy"]["kvCacheDtype"] == "int8"
    assert lineage["stable"]["current"]["spec"]["strategy"]["kvCacheDtype"] == "fp8"
    assert status["stable"]["override"]["reason"] == "promotion"
    assert [a["verdict"] for a in status["canary"]["analyses"]] == ["pass", "pass"]
    reasons = [e[1] for e in run.events]  # type: ignore[attr-defined]
    assert "Promoting" in reasons and "Promoted" in reasons
    assert sample("kvpilot_rollout_promotions_total") == promotions + 1
    assert sample("kvpilot_rollout_phase", phase="Promoted") == 1 and sample("kvpilot_rollout_weight") == 0


def test_failures_roll_back_to_zero_and_scale_the_canary_down() -> None:
    kube, _ctx, clock, _asked, run = setup(["fail", "inconclusive"])
    run()
    clock.t = 10
    assert run()["canary"]["failures"] == 1 and kube.route_weight() == 1
    clock.t = 20
    rollbacks = sample("kvpilot_rollout_rollbacks_total", reason="FailureLimitReached")
    status = run()
    assert status["canary"]["phase"] == "RolledBack" and status["canary"]["weight"] == 0
    assert sample("kvpilot_rollout_rollbacks_total", reason="FailureLimitReached") == rollbacks + 1
    assert kube.route_weight() == 0
    assert kube.find("Deployment", "chat-canary", "apps/v1")["spec"]["replicas"] == 0
    clock.t = 100
    assert run() == status


def test_rollback_after_promotion_restores_the_previous_stable() -> None:
    kube, _ctx, clock, _asked, run = setup(["pass", "pass"])
    for t in (0, 10, 20):
        clock.t = t
        run()
    body = kube.objects[object_path(c.API_VERSION, c.KIND, "ns", "chat")]
    body["spec"]["rollback"] = True
    status = run()
    assert status["canary"]["phase"] == "RolledBack" and status["canary"]["reason"] == "StableRolledBack"
    stable = kube.find("Deployment", "chat-stable", "apps/v1")
    assert "int8" in stable["spec"]["template"]["metadata"]["labels"]["kvpilot.io/strategy"]
    engine = stable["spec"]["template"]["spec"]["containers"][0]
    assert engine["args"][engine["args"].index("--model-sha256") + 1] == "ab" * 32


def test_without_gateway_api_crds_the_rollout_waits_with_a_condition() -> None:
    kube, _ctx, _clock, _asked, run = setup([])
    kube.crds.clear()
    status = run()
    assert status["canary"]["weight"] == 0 and status["canary"]["reason"] == "TrafficSplitUnavailable"
    split = next(cond for cond in status["conditions"] if cond["type"] == "TrafficSplit")
    assert split["status"] == "False" and split["reason"] == "GatewayAPIMissing"


def test_an_infeasible_canary_is_refused_before_any_pod() -> None:
    kube, _ctx, _clock, _asked, run = setup([], strategy={"attention": "gqa", "kvHeadGroups": 3})
    status = run()
    assert status["canary"]["phase"] == "Failed" and status["canary"]["reason"] == "CanaryInfeasible"
    assert "kvHeadGroups" in status["canary"]["message"] or "divide" in status["canary"]["message"]
    assert kube.find("Deployment", "chat-canary", "apps/v1") is None
    assert kube.find("Service", "chat-canary") is None
    canary = next(cond for cond in status["conditions"] if cond["type"] == "Canary")
    assert canary["status"] == "False" and canary["reason"] == "CanaryInfeasible"
    assert ("Warning", "CanaryInfeasible") in [(e[0], e[1]) for e in run.events]  # type: ignore[attr-defined]
