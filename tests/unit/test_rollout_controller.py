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
from kvpilot.operator.context import Context
from kvpilot.operator.kube import KubeError, object_path
from kvpilot.operator.options import Options
from kvpilot.operator.reconcile.reconciler import reconcile
from kvpilot.operator.rollout import RunAnalysis
from kvpilot.operator.rollout.controller import tick
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

    pods: list[dict[str, Any]]  # what GET .../pods lists (label selectors: k=v,k=v)

    def request(self, method: str, path: str, *, body: Any = None, params: Any = None, **_: Any) -> dict[str, Any]:
        if method == "PATCH" and "/httproutes/" in path:
            return self.apply(body)
        if method == "GET" and path == "/api/v1/namespaces/ns/pods":
            wanted = dict(kv.split("=", 1) for kv in (params or {}).get("labelSelector", "").split(",") if kv)
            pods = getattr(self, "pods", [])
            return {"items": [copy.deepcopy(p) for p in pods
                              if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]}
        if method == "GET" and path.endswith("/httproutes"):
            return {"items": [copy.deepcopy(o) for p, o in self.objects.items() if "/httproutes/" in p]}
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


def canary_pod(restarts: int = 0, ready: bool = True, **state: Any) -> dict[str, Any]:
    return {"metadata": {"name": "chat-canary-x", "labels": {c.LABEL_SERVICE: "chat", c.LABEL_TRACK: "canary"}},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                       **({} if ready else {"reason": "ContainersNotReady",
                                                            "message": "containers with unready status: [engine]"})}],
                       "containerStatuses": [{"name": "engine", "restartCount": restarts,
                                              "state": state or {"running": {}}}]}}


@pytest.mark.parametrize("broken", [
    canary_pod(restarts=1),
    canary_pod(restarts=1, waiting={"reason": "CrashLoopBackOff", "message": "back-off 10s"}),
    canary_pod(ready=False),
], ids=["restarted", "crash-loop", "unready"])
def test_a_canary_that_crashes_mid_step_is_rolled_back_at_once(broken: dict[str, Any]) -> None:
    kube, _ctx, clock, asked, run = setup(["pass"])
    kube.pods = [canary_pod()]
    status = run()
    assert status["canary"]["weight"] == 1 and status["canary"]["restartsAtStart"] == 0
    clock.t = 3
    assert run()["canary"]["phase"] == "Progressing"  # healthy: the window runs on
    kube.pods = [broken]
    clock.t = 4  # well inside the 10 s window: no analysis was asked for
    status = run()
    assert status["canary"]["phase"] == "RolledBack" and status["canary"]["reason"] == "CanaryCrashed", status
    assert "chat-canary-x" in status["canary"]["message"] or "restarted 1 time" in status["canary"]["message"]
    assert asked == [] and kube.route_weight() == 0
    assert kube.find("Deployment", "chat-canary", "apps/v1")["spec"]["replicas"] == 0


def test_restarts_before_the_first_step_are_the_baseline() -> None:
    kube, _ctx, clock, _asked, run = setup(["pass"])
    kube.pods = [canary_pod(restarts=2)]  # restarted during its start (e.g. an OOM at warm-up), then fine
    status = run()
    assert status["canary"]["restartsAtStart"] == 2
    clock.t = 5
    assert run()["canary"]["phase"] == "Progressing"
    kube.pods = [canary_pod(restarts=3)]
    assert run()["canary"]["reason"] == "CanaryCrashed"


def test_shared_gateway_route_before_during_and_after_a_rollout() -> None:
    from kvpilot.operator.rollout.route import ensure_steady_route

    kube, _ctx, clock, _asked, run = setup(["fail", "fail"])
    path = object_path(c.API_VERSION, c.KIND, "ns", "chat")
    canary = kube.objects[path]["spec"].pop("canary")
    kube.objects[path]["spec"]["route"] = {"modelHeader": "X-Gateway-Model-Name"}
    route_path = "/apis/gateway.networking.k8s.io/v1/namespaces/ns/httproutes/chat"
    assert ensure_steady_route(_ctx, kube.get(path), OPTIONS)
    (rule,) = kube.objects[route_path]["spec"]["rules"]
    model = {"type": "Exact", "name": "X-Gateway-Model-Name", "value": "chat"}
    assert rule["matches"][0]["headers"] == [model] and [b["name"] for b in rule["backendRefs"]] == ["chat"]
    kube.objects[path]["spec"]["canary"] = canary
    run()  # the rollout takes the route over: pins carry the model header too
    rules = kube.objects[route_path]["spec"]["rules"]
    assert all(m["headers"][0] == model for r in rules for m in r["matches"]) and kube.route_weight() == 1
    assert not ensure_steady_route(_ctx, kube.get(path), OPTIONS)  # a rollout in flight owns the route
    kube.objects[path]["spec"]["route"]["hostnames"] = ["chat.example.com"]
    clock.t = 2
    run()  # inside the step's window: the route follows the edit at once, weight unchanged
    assert kube.objects[route_path]["spec"]["hostnames"] == ["chat.example.com"] and kube.route_weight() == 1
    clock.t = 10
    run()
    clock.t = 20
    assert run()["canary"]["phase"] == "RolledBack"
    assert not ensure_steady_route(_ctx, kube.get(path), OPTIONS)  # the rollback's route sends all to stable
    assert kube.route_weight() == 0
    kube.objects[path]["spec"]["route"]["hostnames"] = ["chat.example.org"]
    assert ensure_steady_route(_ctx, kube.get(path), OPTIONS)  # ... until spec.route changes what it matches
    (rule,) = kube.objects[route_path]["spec"]["rules"]
    assert [b["name"] for b in rule["backendRefs"]] == ["chat"]
    assert kube.objects[route_path]["spec"]["hostnames"] == ["chat.example.org"]


def test_an_older_route_with_the_same_matches_is_a_route_conflict() -> None:
    from kvpilot.operator.rollout.route import ensure_steady_route

    kube, ctx, _clock, _asked, _run = setup([])
    path = object_path(c.API_VERSION, c.KIND, "ns", "chat")
    kube.objects[path]["spec"].pop("canary")
    other = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": "other", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
             "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}],
                      "rules": [{"backendRefs": [{"name": "other", "port": 8000}]}]}}
    kube.objects["/apis/gateway.networking.k8s.io/v1/namespaces/ns/httproutes/other"] = other
    ensure_steady_route(ctx, kube.get(path), OPTIONS)
    routed = next(cnd for cnd in kube.get(path)["status"]["conditions"] if cnd["type"] == "Routed")
    assert (routed["status"], routed["reason"]) == ("False", "RouteConflict") and "ns/other" in routed["message"]
    kube.objects[path]["spec"]["route"] = {"modelHeader": "X-Gateway-Model-Name"}
    ensure_steady_route(ctx, kube.get(path), OPTIONS)
    routed = next(cnd for cnd in kube.get(path)["status"]["conditions"] if cnd["type"] == "Routed")
    assert (routed["status"], routed["reason"]) == ("True", "RouteUnique")


def test_promotion_with_a_gateway_reconciles_stable_inside_the_tick() -> None:
    """Promote reconciles stable from inside the tick, and the reconcile's steady-route step takes the
    same object's lock: it must not deadlock (a plain Lock did), and the route must stay the rollout's."""
    import threading

    from kvpilot.operator import options as opts

    previous = opts.current()
    opts.configure(OPTIONS)
    try:
        kube, _ctx, clock, _asked, run = setup(["pass", "pass"])
        done: list[dict] = []
        worker = threading.Thread(target=lambda: done.extend(
            [run(), (setattr(clock, "t", 10), run())[1], (setattr(clock, "t", 20), run())[1]]), daemon=True)
        worker.start()
        worker.join(timeout=20)
        assert not worker.is_alive(), "the tick deadlocked on its own object lock"
        assert done[-1]["canary"]["phase"] == "Promoted" and kube.route_weight() == 0
    finally:
        opts.configure(previous)


def test_a_new_canary_pod_that_is_still_loading_is_no_crash() -> None:
    """The canary grows with its weight: a pod that was never ready is starting, not crashed."""
    kube, _ctx, clock, _asked, run = setup(["pass"])
    kube.pods = [canary_pod()]
    assert run()["canary"]["readyPods"] == ["chat-canary-x"]
    loading = canary_pod(ready=False)
    loading["metadata"]["name"] = "chat-canary-new"
    kube.pods = [canary_pod(), loading]
    clock.t = 4
    status = run()
    assert status["canary"]["phase"] == "Progressing", status["canary"]
    loading["status"]["conditions"][0]["status"] = "True"
    kube.pods = [canary_pod(), loading]
    clock.t = 5
    assert run()["canary"]["readyPods"] == ["chat-canary-new", "chat-canary-x"]
