"""Pod blockers from pods and Events (pure): the scheduler's and the kubelet's own words."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.operator.status.document import with_blockers
from kvpilot.operator.status.pod_blockers import PODS_BLOCKED, blockers_condition, find_blockers, new_blockers

pytestmark = pytest.mark.unit


def pod(name: str = "chat-stable-abc", track: str = "stable", phase: str = "Pending", **status: Any) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kvpilot.io/track": track}},
            "status": {"phase": phase, **status}}


def waiting(reason: str, message: str = "", container: str = "engine", **extra: Any) -> dict:
    return {"name": container, "ready": False, "restartCount": 0,
            "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}, **extra}


def event(pod_name: str, reason: str, message: str, at: str = "2026-01-01T00:00:00Z", kind: str = "Warning") -> dict:
    return {"type": kind, "reason": reason, "message": message, "lastTimestamp": at,
            "involvedObject": {"kind": "Pod", "name": pod_name, "uid": f"uid-{pod_name}"}}


def test_unschedulable_carries_the_schedulers_message() -> None:
    msg = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."
    found = find_blockers([pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                             "message": msg}])])
    assert [(b.reason, b.message, b.track) for b in found] == [("Unschedulable", msg, "stable")]


def test_a_missing_claim_is_named_as_such() -> None:
    msg = '0/2 nodes are available: persistentvolumeclaim "models" not found. preemption: not helpful.'
    found = find_blockers([pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                             "message": msg}])])
    assert found[0].reason == "PersistentVolumeClaimMissing" and 'persistentvolumeclaim "models"' in found[0].message


@pytest.mark.parametrize("reason,message", [
    ("ImagePullBackOff", 'Back-off pulling image "ghcr.io/kvpilot/kvpilot:nope"'),
    ("ErrImagePull", "rpc error: code = NotFound desc = manifest unknown"),
    ("CreateContainerConfigError", 'secret "chat-key" not found'),
])
def test_waiting_containers_report_the_kubelets_message(reason: str, message: str) -> None:
    found = find_blockers([pod(containerStatuses=[waiting(reason, message), {"name": "sidecar", "state":
                                                                               {"running": {}}}])])
    assert [(b.reason, b.message, b.container) for b in found] == [(reason, message, "engine")]


def test_a_crash_loop_reports_the_last_exit_not_the_changing_backoff_text() -> None:
    status = waiting("CrashLoopBackOff", "back-off 40s restarting failed container=engine", restartCount=4,
                     lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137}})
    later = {**status, "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                                 "message": "back-off 1m20s restarting"}}}
    first = find_blockers([pod(phase="Running", containerStatuses=[status])])
    second = find_blockers([pod(phase="Running", containerStatuses=[later])])
    assert first == second
    assert first[0].message == "the container keeps exiting; last exit: OOMKilled, exit code 137"


def test_failed_mount_comes_from_the_newest_event_of_a_pending_pod() -> None:
    p = pod(containerStatuses=[waiting("ContainerCreating")])
    events = [event(p["metadata"]["name"], "FailedMount", 'configmap "old" not found', "2026-01-01T00:00:00Z"),
              event(p["metadata"]["name"], "FailedMount", 'configmap "chat-calibration" not found',
                    "2026-01-01T00:01:00Z"),
              event(p["metadata"]["name"], "Scheduled", "assigned", kind="Normal"),
              event("other-pod", "FailedMount", "not this pod")]
    found = find_blockers([p], events)
    assert [(b.reason, b.message) for b in found] == [("FailedMount", 'configmap "chat-calibration" not found')]


def test_slow_starts_and_running_pods_are_not_blocked() -> None:
    loading = pod(phase="Running", containerStatuses=[{"name": "engine", "ready": False, "started": False,
                                                       "state": {"running": {}}}])
    creating = pod("chat-stable-new", containerStatuses=[waiting("ContainerCreating")])
    resolved = pod("chat-stable-ok", phase="Running", containerStatuses=[{"name": "engine", "state": {"running": {}}}])
    old_event = event("chat-stable-ok", "FailedMount", 'secret "chat-key" not found')
    assert find_blockers([loading, creating, resolved], [old_event]) == []


def test_deleted_pods_are_ignored_and_stable_comes_first() -> None:
    gone = pod("chat-stable-old", containerStatuses=[waiting("ImagePullBackOff", "x")])
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    canary = pod("chat-canary-a", "canary", containerStatuses=[waiting("ErrImagePull", "y")])
    stable = pod("chat-stable-b", containerStatuses=[waiting("ImagePullBackOff", "z")])
    assert [b.pod for b in find_blockers([gone, canary, stable])] == ["chat-stable-b", "chat-canary-a"]


def test_condition_and_status_round_trip() -> None:
    blockers = find_blockers([pod(containerStatuses=[waiting("ImagePullBackOff", 'Back-off pulling image "x"')])])
    cond = blockers_condition(blockers)
    assert (cond.type, cond.status, cond.reason) == (PODS_BLOCKED, "True", "ImagePullBackOff")
    assert cond.message == 'stable pod chat-stable-abc container engine: ImagePullBackOff: Back-off pulling image "x"'
    status = with_blockers({"phase": "Progressing"}, blockers, now="t0")
    assert status["blockedPods"] == [{"pod": "chat-stable-abc", "track": "stable", "reason": "ImagePullBackOff",
                                      "message": 'Back-off pulling image "x"', "container": "engine"}]
    assert new_blockers(status["blockedPods"], blockers) == []
    cleared = with_blockers(status, [], now="t1")
    assert "blockedPods" not in cleared
    cond = next(c for c in cleared["conditions"] if c["type"] == PODS_BLOCKED)
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == ("False", "NoBlockers", "t1")


def test_many_blockers_are_summarised() -> None:
    pods = [pod(f"chat-stable-{i}", containerStatuses=[waiting("ErrImagePull", "m")]) for i in range(5)]
    assert blockers_condition(find_blockers(pods)).message.endswith("; and 2 more (status.blockedPods)")


def test_a_failed_init_container_reports_its_termination_message() -> None:
    status = {"name": "storage-init", "restartCount": 0,
              "state": {"terminated": {"exitCode": 3, "reason": "Error",
                                       "message": "sha256 of model.safetensors is 9f..., the lineage pins 3f..."}}}
    found = find_blockers([pod(initContainerStatuses=[status])])
    assert [(b.reason, b.container) for b in found] == [("InitContainerFailed", "storage-init")]
    assert found[0].message == "exit code 3: sha256 of model.safetensors is 9f..., the lineage pins 3f..."
    looping = {**status, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "message": "digest mismatch"}}}
    assert find_blockers([pod(initContainerStatuses=[looping])])[0].message == (
        "the container keeps exiting; last exit: Error, exit code 3: digest mismatch")
