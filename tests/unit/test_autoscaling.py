"""spec.autoscaling: validation, the HPA per track, canary bounds, and who owns spec.replicas."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvpilot.operator import constants as c
from kvpilot.operator.autoscaling import policy
from kvpilot.operator.autoscaling.hpa import adapter_rule, build_hpa, quantity
from kvpilot.operator.autoscaling.policy import HANDOFF_MANAGER, leave_replicas, owns_replicas, track_bounds
from kvpilot.operator.autoscaling.spec import AutoscalingError, AutoscalingSpec
from kvpilot.operator.kube import KubeError, object_path
from tests.unit.operator_fakes import service

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("raw", "message"), [
    ({"minReplicas": 1}, "maxReplicas is required"),
    ({"maxReplicas": 2, "minReplicas": 3}, "1 <= minReplicas <= maxReplicas, got 3 and 2"),
    ({"maxReplicas": 2, "minReplicas": 0}, "1 <= minReplicas"),
    ({"maxReplicas": 2, "metric": "cpu"}, "'cpu' is not one of queueDepth, kvCacheUsage, concurrency"),
    ({"maxReplicas": 2, "metric": "kvCacheUsage", "target": 80}, "must be in (0, 1], got 80"),
    ({"maxReplicas": 2, "target": 0}, "must be above 0"),
    ({"maxReplicas": "many"}, "are integers"),
])  # fmt: skip
def test_bad_autoscaling_specs_say_what_is_allowed(raw, message):
    with pytest.raises(AutoscalingError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        AutoscalingSpec.from_dict(raw)


def test_absent_or_disabled_autoscaling_leaves_sizing_to_the_operator():
    assert AutoscalingSpec.from_dict(None) is None
    assert AutoscalingSpec.from_dict({"enabled": False, "maxReplicas": 4}) is None
    spec = AutoscalingSpec.from_dict({"maxReplicas": 4, "metric": "kvCacheUsage"})
    assert (spec.min_replicas, spec.max_replicas, spec.target, spec.metric_name) == (
        1, 4, 0.8, "kvpilot_kv_cache_usage_ratio")


def test_hpa_targets_the_tracks_deployment_on_a_per_track_external_metric():
    owner = service("chat")
    scaling = AutoscalingSpec.from_dict({"minReplicas": 2, "maxReplicas": 8, "metric": "concurrency", "target": 0.5})
    hpa = build_hpa(owner, "canary", scaling, min_replicas=1, max_replicas=2, max_concurrency=90)
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["metadata"]["name"] == "chat-canary"
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "uid-chat"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat-canary"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 2)
    (metric,) = spec["metrics"]
    assert metric["external"]["metric"] == {"name": "kvpilot_requests_running",
                                            "selector": {"matchLabels": {"service": "chat", "track": "canary"}}}
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "45"}  # 0.5 x 90
    assert "kvpilot_requests_running" in adapter_rule()["seriesQuery"]


def test_quantities():
    assert [quantity(v) for v in (4, 4.0, 0.8, 0.125)] == ["4", "4", "800m", "125m"]


def test_canary_bounds_follow_its_weight_and_the_stable_pods_running_now():
    scaling = AutoscalingSpec.from_dict({"minReplicas": 2, "maxReplicas": 10})
    assert track_bounds(scaling, "stable") == (2, 10)
    assert track_bounds(scaling, "canary", 5, stable_replicas=6) == (1, 1)
    assert track_bounds(scaling, "canary", 50, stable_replicas=6) == (3, 5)
    assert track_bounds(scaling, "canary", 100, stable_replicas=7) == (7, 10)


class OwnershipKube:
    """get/apply/request over one Deployment, with managedFields as the API server would write them."""

    def __init__(self, live: dict[str, Any] | None) -> None:
        self.live = live
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def get(self, path: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.live)

    def request(self, method: str, path: str, *, body: Any = None, params: Any = None,
                content_type: str = "") -> dict[str, Any]:
        self.patches.append((params["fieldManager"], body))
        return {}


def _deployment(replicas: int | None, manager: str) -> dict[str, Any]:
    spec = {} if replicas is None else {"replicas": replicas}
    fields = {"f:spec": {"f:replicas": {}, "f:template": {}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": "chat-stable", "namespace": "ns",
        "managedFields": [{"manager": manager, "operation": "Apply" if manager == c.FIELD_MANAGER else "Update",
                           "fieldsV1": fields}]}, "spec": spec}


BUILT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat-stable", "namespace": "ns"},
         "spec": {"replicas": 2, "template": {}}}


def test_a_new_deployment_starts_at_the_hpas_minimum():
    out = leave_replicas(OwnershipKube(None), BUILT, initial=3, bounds=(3, 8))
    assert out["spec"]["replicas"] == 3


def test_the_operator_lets_go_of_replicas_through_a_handoff_at_the_live_value():
    kube = OwnershipKube(_deployment(5, c.FIELD_MANAGER))
    out = leave_replicas(kube, BUILT, initial=2, bounds=(2, 8))
    assert "replicas" not in out["spec"] and BUILT["spec"]["replicas"] == 2  # the built dict is not changed
    assert kube.patches == [(HANDOFF_MANAGER, {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "metadata": {"name": "chat-stable", "namespace": "ns"},
                                               "spec": {"replicas": 5}})]


def test_replicas_the_hpa_owns_are_left_alone():
    kube = OwnershipKube(_deployment(7, "kube-controller-manager"))
    assert not owns_replicas(kube.live)
    out = leave_replicas(kube, BUILT, initial=2, bounds=(2, 8))
    assert "replicas" not in out["spec"] and kube.patches == []


def test_a_track_outside_new_bounds_is_brought_inside():
    kube = OwnershipKube(_deployment(12, "kube-controller-manager"))
    leave_replicas(kube, BUILT, initial=2, bounds=(2, 8))
    assert kube.patches[0][1]["spec"] == {"replicas": 8}


class ScaledUnderneathKube(OwnershipKube):
    """The HPA scales the Deployment after each read: a handoff carrying the read's resourceVersion is
    refused (409) as the API server refuses a stale precondition, and the next read sees the new count."""

    def __init__(self, live: dict[str, Any], scale_to: list[int]) -> None:
        super().__init__(live)
        self.scale_to = scale_to

    def get(self, path: str) -> dict[str, Any] | None:
        seen = super().get(path)
        if self.scale_to:  # the HPA writes right after this read
            self.live["spec"]["replicas"] = self.scale_to.pop(0)
            self.live["metadata"]["resourceVersion"] = str(int(self.live["metadata"]["resourceVersion"]) + 1)
            self.live["metadata"]["managedFields"][0]["manager"] = "kube-controller-manager"
            self.live["metadata"]["managedFields"][0]["operation"] = "Update"
        return seen

    def request(self, method: str, path: str, *, body: Any = None, params: Any = None,
                content_type: str = "") -> dict[str, Any]:
        if body["metadata"].get("resourceVersion") != self.live["metadata"]["resourceVersion"]:
            raise KubeError(method, path, 409, "the object has been modified")
        self.live["spec"]["replicas"] = body["spec"]["replicas"]
        return super().request(method, path, body=body, params=params, content_type=content_type)


def test_a_handoff_never_puts_back_a_count_the_hpa_changed_after_the_read():
    live = _deployment(1, c.FIELD_MANAGER)  # the operator created the canary at 1 and still owns the count
    live["metadata"]["resourceVersion"] = "10"
    kube = ScaledUnderneathKube(live, scale_to=[2])  # the HPA scales 1 -> 2 between the read and the handoff
    out = leave_replicas(kube, BUILT, initial=1, bounds=(1, 3))
    assert "replicas" not in out["spec"]
    assert kube.live["spec"]["replicas"] == 2 and kube.patches == []  # refused, re-read: the HPA owns 2, left alone


def test_a_handoff_that_keeps_losing_the_race_keeps_the_count_for_the_next_reconcile(monkeypatch):
    monkeypatch.setattr(policy, "HANDOFF_BACKOFF_S", 0.0)
    live = _deployment(1, c.FIELD_MANAGER)
    live["metadata"]["resourceVersion"] = "10"
    kube = ScaledUnderneathKube(live, scale_to=[9] * 10)  # always out of bounds, always moved on
    out = leave_replicas(kube, BUILT, initial=1, bounds=(1, 3))
    assert out["spec"]["replicas"] == 3  # the apply keeps owning it, clamped into the bounds, this once
    assert kube.patches == [] and kube.live["spec"]["replicas"] == 9


def test_object_path_knows_hpas():
    assert object_path("autoscaling/v2", "HorizontalPodAutoscaler", "ns", "chat-stable") == (
        "/apis/autoscaling/v2/namespaces/ns/horizontalpodautoscalers/chat-stable")


def _fake_run():
    from tests.unit.operator_fakes import FakeKube

    return FakeKube()


def test_apply_track_writes_an_hpa_when_on_and_removes_it_when_off():
    from kvpilot.operator.autoscaling.tracks import apply_track

    kube = _fake_run()
    owner = service("chat")
    scaling = AutoscalingSpec.from_dict({"minReplicas": 2, "maxReplicas": 6})
    built = copy.deepcopy(BUILT)
    applied = apply_track(kube, owner, built, scaling, "stable", max_concurrency=8)
    assert applied["spec"]["replicas"] == 2  # created at the HPA's minimum, not spec.replicas
    hpa_path = object_path("autoscaling/v2", "HorizontalPodAutoscaler", "ns", "chat-stable")
    assert kube.objects[hpa_path]["spec"]["minReplicas"] == 2
    apply_track(kube, owner, built, None, "stable", max_concurrency=8)
    assert hpa_path not in kube.objects and ("DELETE", hpa_path) in kube.requests
    zero = copy.deepcopy(BUILT)
    zero["spec"]["replicas"] = 0  # a canary scaled to no pods is never autoscaled
    canary_hpa = object_path("autoscaling/v2", "HorizontalPodAutoscaler", "ns", "chat-canary")
    kube.add({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
              "metadata": {"name": "chat-canary", "namespace": "ns"}, "spec": {}})
    del kube.requests[:]
    apply_track(kube, owner, zero, scaling, "canary", max_concurrency=8)
    assert canary_hpa not in kube.objects
    # The HPA goes before the Deployment is applied at 0 pods: it cannot scale the track back up in between.
    assert [r for r in kube.requests if r[0] in ("DELETE", "APPLY")] == [
        ("DELETE", canary_hpa), ("APPLY", object_path("apps/v1", "Deployment", "ns", "chat-stable"))]


def test_the_canary_hpa_follows_the_weight_against_the_stable_pods_running_now():
    from kvpilot.operator.autoscaling.tracks import apply_track

    kube = _fake_run()
    owner = service("chat")
    stable = copy.deepcopy(BUILT)
    stable["spec"]["replicas"] = 6  # as the stable HPA left it
    kube.add(stable)
    scaling = AutoscalingSpec.from_dict({"minReplicas": 2, "maxReplicas": 10})
    canary = copy.deepcopy(BUILT)
    canary["metadata"]["name"] = "chat-canary"
    hpa_path = object_path("autoscaling/v2", "HorizontalPodAutoscaler", "ns", "chat-canary")
    handoffs: list[int] = []

    def handoff(method: str, path: str, *, body: Any = None, params: Any = None, content_type: str = "") -> Any:
        handoffs.append(body["spec"]["replicas"])  # the handoff manager brings the live count inside the bounds
        kube.objects[path]["spec"]["replicas"] = body["spec"]["replicas"]
        return {}

    kube.request = handoff  # type: ignore[attr-defined]
    for weight, bounds in ((5, (1, 1)), (50, (3, 5)), (100, (6, 10))):
        apply_track(kube, owner, canary, scaling, "canary", max_concurrency=8, weight=weight)
        spec = kube.objects[hpa_path]["spec"]
        assert (spec["minReplicas"], spec["maxReplicas"]) == bounds, weight
        assert spec["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]["track"] == "canary"
    assert handoffs == [3, 6]  # each weight step moved the canary into its new bounds before the HPA took over


def test_the_autoscaling_timer_interval_is_an_operator_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import kopf

    from kvpilot.operator import cli, options

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.parse_args(["-n", "a"]).autoscaling_interval == 30.0
    monkeypatch.setattr(kopf, "run", lambda **kw: None)
    monkeypatch.setattr(kopf, "configure", lambda **kw: None)
    monkeypatch.setattr(options, "_current", options.Options())  # restored after the test
    assert cli.run(parser.parse_args(["-n", "a", "--autoscaling-interval", "2"])) == 0
    assert options.current().autoscaling_interval_s == 2.0
    with pytest.raises(SystemExit, match="--autoscaling-interval must be > 0 seconds, got 0"):
        cli.run(parser.parse_args(["-n", "a", "--autoscaling-interval", "0"]))
