"""One reconcile against an in-memory API: preflight, children, status, events, no-op resync."""

from __future__ import annotations

import copy

import pytest
from operator_fakes import DEEPSEEK_V3, FakeKube, Run, service

from kvpilot.operator import constants as c
from kvpilot.operator.reconcile.reconciler import InvalidSpec, RetryLater, reconcile
from kvpilot.operator.status.conditions import get_condition
from kvpilot.operator.status.follow_deployment import follow_deployment

pytestmark = pytest.mark.unit


def test_feasible_service_gets_children_status_and_events() -> None:
    run = Run(FakeKube())
    plan = run.reconcile(service())
    assert plan.feasible
    for kind, name in (("ConfigMap", "chat-lineage"), ("Service", "chat"), ("Service", "chat-metrics")):
        assert run.kube.find(kind, name) is not None
    assert run.kube.find("Deployment", "chat-stable", "apps/v1") is not None
    status = run.status()
    assert status["phase"] == "Progressing" and status["ready"] == "0/2"
    assert status["capacity"]["maxConcurrency"] == plan.max_concurrency
    assert status["capacity"]["bytesPerToken"] == plan.bytes_per_token
    assert status["observedGeneration"] == 1 and status["strategy"] == "gqa4-int8"
    assert get_condition(status["conditions"], "CapacityPlanned")["status"] == "True"
    monitoring = get_condition(status["conditions"], "Monitoring")
    assert monitoring["status"] == "False" and monitoring["reason"] == "PrometheusOperatorMissing"
    reasons = [e[1] for e in run.events]
    assert reasons == ["CapacityPlanned", "RolloutStarted", "PrometheusOperatorMissing"]


def test_resync_without_changes_writes_nothing_and_says_nothing() -> None:
    run = Run(FakeKube())
    run.reconcile(service())
    body = run.kube.find(c.KIND, "chat", c.API_VERSION)
    writes, events = len(run.kube.writes), len(run.events)
    reconcile(run.ctx, copy.deepcopy(body))
    assert run.kube.writes[writes:] == []
    assert run.events[events:] == []


def test_podmonitor_when_the_prometheus_operator_is_installed() -> None:
    run = Run(FakeKube(crds=(c.PODMONITOR_CRD,)))
    run.reconcile(service())
    assert run.kube.find("PodMonitor", "chat", "monitoring.coreos.com/v1") is not None
    assert get_condition(run.status()["conditions"], "Monitoring")["reason"] == "PodMonitorApplied"


def test_oversized_model_is_infeasible_and_schedules_nothing() -> None:
    run = Run(FakeKube())
    body = service(config=DEEPSEEK_V3, strategy={"attention": "native", "maxSeqLen": 4096},
                   resources={"gpus": 1, "gpuProduct": "NVIDIA-A10G"})
    plan = run.reconcile(body)
    assert not plan.feasible
    assert run.kube.find("Deployment", "chat-stable", "apps/v1") is None
    assert [p for p in run.kube.writes if "/status" not in p] == []
    status = run.status()
    assert status["phase"] == "Infeasible"
    cond = get_condition(status["conditions"], "CapacityPlanned")
    assert cond["status"] == "False" and cond["reason"] == "Infeasible"
    assert "exceed 1 x NVIDIA-A10G" in cond["message"] and "GiB" in cond["message"]
    assert run.events[0][:2] == ("Warning", "CapacityInfeasible")


def test_strategy_change_updates_the_deployment_and_keeps_lineage() -> None:
    run = Run(FakeKube())
    run.reconcile(service())
    body = run.kube.find(c.KIND, "chat", c.API_VERSION)
    body["spec"]["strategy"] = {"attention": "native", "kvCacheDtype": "bf16", "maxSeqLen": 8192}
    body["metadata"]["generation"] = 2
    run.kube.add(body)
    run.reconcile(body)
    dep = run.kube.find("Deployment", "chat-stable", "apps/v1")
    assert dep["metadata"]["generation"] == 2
    assert "--kv-head-groups" not in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    status = run.status()
    assert status["strategy"] == "native-bf16" and status["observedGeneration"] == 2
    assert [e[1] for e in run.events].count("RolloutStarted") == 2


def test_missing_config_map_retries_and_says_which() -> None:
    run = Run(FakeKube())
    body = service(model={"uri": "/models/x", "configMapRef": {"name": "llama-config", "key": "config.json"}})
    with pytest.raises(RetryLater, match="ConfigMap ns/llama-config"):
        run.reconcile(body)
    assert run.status()["phase"] == "Pending"
    assert get_condition(run.status()["conditions"], "CapacityPlanned")["reason"] == "ModelConfigUnavailable"


def test_config_map_config_is_used() -> None:
    import json

    from operator_fakes import LLAMA3_8B

    kube = FakeKube()
    kube.add({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "llama-config", "namespace": "ns"},
              "data": {"config.json": json.dumps(LLAMA3_8B)}})
    run = Run(kube)
    plan = run.reconcile(service(model={"uri": "/models/x", "configMapRef": {"name": "llama-config"}}))
    assert plan.feasible and plan.bytes_per_token > 0


def test_unplannable_spec_is_a_permanent_failure_naming_the_field() -> None:
    run = Run(FakeKube())
    with pytest.raises(InvalidSpec, match="kv_head_groups 3 must divide the model's 8 KV heads"):
        run.reconcile(service(strategy={"attention": "gqa", "kvHeadGroups": 3}))
    assert run.status()["phase"] == "Failed"
    with pytest.raises(InvalidSpec, match="not in the planner's table"):
        run.reconcile(service(resources={"gpus": 1, "gpuProduct": "NVIDIA-B999"}))


def test_deployment_status_flows_into_ready() -> None:
    run = Run(FakeKube())
    run.reconcile(service())
    dep = run.kube.find("Deployment", "chat-stable", "apps/v1")
    dep["status"] = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                     "availableReplicas": 2}
    assert follow_deployment(run.ctx, dep) is not None
    status = run.status()
    assert status["phase"] == "Ready" and status["ready"] == "2/2" and status["readyReplicas"] == 2
    assert get_condition(status["conditions"], "Ready")["status"] == "True"
    assert get_condition(status["conditions"], "Progressing")["reason"] == "RolloutComplete"
    assert run.events[-1][:2] == ("Normal", "Ready")
    writes, requests = len(run.kube.writes), len(run.kube.requests)
    assert follow_deployment(run.ctx, dep) is None  # same status again: no write, not even a read
    assert len(run.kube.writes) == writes and len(run.kube.requests) == requests


def test_ready_is_announced_once_when_the_reconciler_sees_the_deployment_ready_first() -> None:
    run = Run(FakeKube())
    body = service()
    run.reconcile(body)
    dep = run.kube.find("Deployment", "chat-stable", "apps/v1")
    dep["status"] = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                     "availableReplicas": 2}
    run.reconcile(body)  # a resync whose status write carries the Deployment's Ready state before the follower's
    assert run.status()["phase"] == "Ready"
    assert [e[1] for e in run.events].count("Ready") == 1
    follow_deployment(run.ctx, dep)  # the follower then finds Ready already True: no second Event
    assert [e[1] for e in run.events].count("Ready") == 1


def test_stale_cached_object_costs_one_conflict_then_succeeds() -> None:
    run = Run(FakeKube())
    run.reconcile(service())
    live = run.kube.find(c.KIND, "chat", c.API_VERSION)
    live["metadata"]["resourceVersion"] = "999"  # someone else wrote (kopf's annotations)
    dep = run.kube.find("Deployment", "chat-stable", "apps/v1")
    dep["status"] = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                     "availableReplicas": 2}
    assert follow_deployment(run.ctx, dep) is not None
    assert run.status()["phase"] == "Ready"


def test_a_refused_child_is_reported_and_retried() -> None:
    from kvpilot.operator.kube import KubeError

    kube = FakeKube()
    real_apply = kube.apply

    def apply(obj: dict) -> dict:
        if obj["kind"] == "Service":
            raise KubeError("PATCH", "/api/v1/namespaces/ns/services/chat", 500, "range is full")
        return real_apply(obj)

    kube.apply = apply  # type: ignore[method-assign]
    run = Run(kube)
    with pytest.raises(RetryLater, match="range is full"):
        run.reconcile(service())
    status = run.status()
    assert status["phase"] == "Degraded"
    degraded = get_condition(status["conditions"], "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ApplyFailed"
    assert run.events[-1][:2] == ("Warning", "ApplyFailed")
    kube.apply = real_apply  # type: ignore[method-assign]
    run.reconcile(service())
    assert get_condition(run.status()["conditions"], "Degraded")["status"] == "False"
    assert run.status()["phase"] == "Progressing"
