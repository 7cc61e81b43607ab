"""Strategy-aware scaling: the planner's denser strategy under sustained KV pressure, in status and as a canary."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvpilot.operator.autoscaling.denser import candidates, propose, under_kv_pressure
from kvpilot.operator.autoscaling.watch import observe
from kvpilot.operator.kube import object_path
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec
from tests.unit.operator_fakes import LLAMA3_8B, FakeKube, service

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


def _spec(**strategy: Any) -> ServiceSpec:
    return ServiceSpec.from_dict({"model": {"uri": "pvc://m/llama", "config": LLAMA3_8B},
                                  "strategy": {"kvCacheDtype": "bf16", "maxSeqLen": 32768, **strategy},
                                  "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H200"}})


def _hpa(current: int, maximum: int, limited_since: str | None) -> dict[str, Any]:
    conditions = [] if limited_since is None else [
        {"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas", "lastTransitionTime": limited_since}]
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "chat-stable", "namespace": "ns"}, "spec": {"maxReplicas": maximum},
            "status": {"currentReplicas": current, "desiredReplicas": current, "conditions": conditions}}


def test_candidates_come_in_order_of_accuracy_risk():
    assert [c.strategy for c in candidates(_spec(), LLAMA3_8B)] == [
        {"kvCacheDtype": "int8"}, {"attention": "gqa", "kvHeadGroups": 4}, {"attention": "mla", "latentRank": 512}]
    assert next(c.strategy for c in candidates(_spec(kvCacheDtype="int8"), LLAMA3_8B)) == {
        "attention": "gqa", "kvHeadGroups": 4}


def test_the_planner_shows_what_int8_buys_on_llama3_8b_at_32k():
    spec = _spec()
    proposal = propose(spec, LLAMA3_8B, preflight(spec, LLAMA3_8B), replicas=4)
    assert proposal is not None and proposal.strategy == {"kvCacheDtype": "int8"}
    assert (proposal.current_concurrency, proposal.proposed_concurrency) == (24, 43)
    assert proposal.replicas_for_same_concurrency == 3
    assert "24 -> 43" in proposal.to_status()["message"]


def test_pressure_means_held_at_max_on_a_kv_signal_for_the_window():
    limited = _hpa(4, 4, "2027-01-15T08:00:00Z")
    t = limited["status"]["conditions"][0]
    from datetime import datetime
    since = datetime.fromisoformat(t["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
    assert under_kv_pressure(limited, "kvCacheUsage", 4, since + 301, 300)
    assert not under_kv_pressure(limited, "kvCacheUsage", 4, since + 100, 300)  # not sustained yet
    assert not under_kv_pressure(limited, "queueDepth", 4, since + 301, 300)  # not a KV signal
    assert not under_kv_pressure(_hpa(3, 4, None), "kvCacheUsage", 4, since + 301, 300)


def _kube_with(body: dict[str, Any], hpa: dict[str, Any]) -> FakeKube:
    kube = FakeKube()
    kube.add(body)
    kube.add(hpa)
    return kube


def _body(**autoscaling: Any) -> dict[str, Any]:
    return service("chat", strategy={"kvCacheDtype": "bf16", "maxSeqLen": 32768},
                   autoscaling={"maxReplicas": 4, "metric": "kvCacheUsage", **autoscaling})


def test_status_proposes_and_only_start_writes_the_canary():
    from datetime import datetime
    since = datetime.fromisoformat("2027-01-15T08:00:00Z".replace("Z", "+00:00")).timestamp()
    events: list[tuple[str, str, str]] = []
    body = _body()
    kube = _kube_with(body, _hpa(4, 4, "2027-01-15T08:00:00Z"))
    out = observe(kube, copy.deepcopy(body), lambda *e: events.append(e), now_s=since + 600)
    assert out["kvPressure"] is True and out["proposal"]["strategy"] == {"kvCacheDtype": "int8"}
    live = kube.objects[object_path("kvpilot.io/v1alpha1", "InferenceService", "ns", "chat")]
    assert live["status"]["autoscaling"]["proposal"]["gain"] > 1.2 and "canary" not in live["spec"]
    assert events[-1][1] == "DenserStrategyProposed"

    body = _body(denserStrategy="start")
    kube = _kube_with(body, _hpa(4, 4, "2027-01-15T08:00:00Z"))
    out = observe(kube, copy.deepcopy(body), lambda *e: events.append(e), now_s=since + 600)
    assert out["proposal"]["started"].startswith("no: spec.autoscaling.probeSet is empty")

    body = _body(denserStrategy="start", probeSet="kvpilot-probes")
    kube = _kube_with(body, _hpa(4, 4, "2027-01-15T08:00:00Z"))
    patches: list[tuple[str, dict[str, Any]]] = []
    kube.merge_patch = lambda path, patch: patches.append((path, patch)) or {}  # type: ignore[attr-defined]
    out = observe(kube, copy.deepcopy(body), lambda *e: events.append(e), now_s=since + 600)
    assert out["proposal"]["started"] == "yes: spec.canary written"
    assert patches[0][1] == {"spec": {"canary": {"strategy": {"kvCacheDtype": "int8"},
                                                 "analysis": {"probeSet": "kvpilot-probes"}}}}

    # The next ticks: the proposal runs as spec.canary (a rollout is not started twice); a canary of
    # another strategy is left alone.
    for canary, started in (({"strategy": {"kvCacheDtype": "int8"}, "analysis": {"probeSet": "kvpilot-probes"}},
                              "yes: spec.canary runs it (rollout Progressing)"),
                             ({"strategy": {"attention": "gqa", "kvHeadGroups": 2}},
                              "no: a rollout of another strategy (spec.canary) is already there")):
        body = _body(denserStrategy="start", probeSet="kvpilot-probes")
        body["spec"]["canary"] = canary
        body["status"] = {**(body.get("status") or {}), "canary": {"phase": "Progressing"}}
        kube = _kube_with(body, _hpa(4, 4, "2027-01-15T08:00:00Z"))
        patches.clear()
        out = observe(kube, copy.deepcopy(body), lambda *e: events.append(e), now_s=since + 600)
        assert out["proposal"]["started"] == started and patches == []


def test_no_pressure_no_proposal():
    body = _body()
    kube = _kube_with(body, _hpa(2, 4, None))
    out = observe(kube, copy.deepcopy(body), lambda *e: None, now_s=NOW)
    assert out["kvPressure"] is False and "proposal" not in out
    assert out["tracks"]["stable"]["currentReplicas"] == 2
