"""Why a track's pods do not run, from the pods and their Events (pure): scheduler and kubelet words.

A pod is blocked when the scheduler cannot place it (`PodScheduled=False/Unschedulable`, which is
also how a missing PersistentVolumeClaim shows), when a container waits for something that will
not come by itself (an image that cannot be pulled, a crash loop, a missing Secret or ConfigMap
key: `CreateContainerConfigError`), or when the kubelet cannot mount a volume (a `FailedMount`
Event: the pod itself only says `ContainerCreating`). A slow start is not a blocker: a container
that runs but is not ready yet (weights loading behind the startup probe) is never reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.status.conditions import PODS_BLOCKED, Condition

MAX_MESSAGE = 900  # a condition message stays readable in `kubectl describe`
WAITING_REASONS = frozenset({
    "ImagePullBackOff", "ErrImagePull", "ErrImageNeverPull", "InvalidImageName", "CrashLoopBackOff",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})
EVENT_REASONS = frozenset({"FailedMount", "FailedAttachVolume", "FailedCreatePodSandBox"})
_MISSING_CLAIM = re.compile(r'persistentvolumeclaim "[^"]+" not found')


@dataclass(frozen=True)
class Blocker:
    """One pod (or one of its containers) that cannot run, in the words of the component that said so."""

    pod: str
    track: str
    reason: str
    message: str
    container: str = ""

    def describe(self) -> str:
        where = f"pod {self.pod}" + (f" container {self.container}" if self.container else "")
        return f"{self.track} {where}: {self.reason}: {self.message}"

    def to_status(self) -> dict[str, str]:
        out = {"pod": self.pod, "track": self.track, "reason": self.reason, "message": self.message}
        if self.container:
            out["container"] = self.container
        return out

    @property
    def key(self) -> tuple[str, str, str]:
        return self.pod, self.container, self.reason


def find_blockers(pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]] = ()) -> list[Blocker]:
    """Every blocked pod of `pods` (one track or several), ordered by track, pod and container."""
    by_uid: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        uid = (event.get("involvedObject") or {}).get("uid")
        if uid and event.get("type") == "Warning" and event.get("reason") in EVENT_REASONS:
            by_uid.setdefault(uid, []).append(event)
    out: list[Blocker] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        out += _pod_blockers(pod, by_uid.get(meta.get("uid", ""), []))
    return sorted(out, key=lambda b: (b.track != "stable", b.track, b.pod, b.container, b.reason))


def _pod_blockers(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[Blocker]:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    name, track = str(meta.get("name", "")), str((meta.get("labels") or {}).get(c.LABEL_TRACK, ""))
    scheduled = next((x for x in status.get("conditions") or () if x.get("type") == "PodScheduled"), None)
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        message = str(scheduled.get("message") or "no node fits the pod")
        reason = "PersistentVolumeClaimMissing" if _MISSING_CLAIM.search(message) else "Unschedulable"
        return [Blocker(name, track, reason, _clip(message))]
    out = []
    for kind in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(kind) or ():
            waiting = (cs.get("state") or {}).get("waiting") or {}
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if waiting.get("reason") in WAITING_REASONS:
                out.append(Blocker(name, track, str(waiting["reason"]), _clip(_waiting_message(cs, waiting)),
                                   str(cs.get("name", ""))))
            elif kind == "initContainerStatuses" and terminated and terminated.get("exitCode") not in (0, None):
                # between the failure and the back-off (Init:Error): the init container's own last words
                text = f"exit code {terminated['exitCode']}" + (f": {str(terminated['message']).strip()}"
                                                               if terminated.get("message") else "")
                out.append(Blocker(name, track, "InitContainerFailed", _clip(text), str(cs.get("name", ""))))
    if out or status.get("phase") not in (None, "Pending"):
        return out
    latest: dict[str, Mapping[str, Any]] = {}
    for event in events:  # the newest Event of each reason: the kubelet repeats them with a count
        reason = str(event["reason"])
        if reason not in latest or _event_time(event) >= _event_time(latest[reason]):
            latest[reason] = event
    return [Blocker(name, track, reason, _clip(str(event.get("message") or reason)))
            for reason, event in sorted(latest.items())]


def _waiting_message(cs: Mapping[str, Any], waiting: Mapping[str, Any]) -> str:
    """The kubelet's message; for a crash loop the last exit instead (its back-off text changes every time)."""
    if waiting.get("reason") == "CrashLoopBackOff":
        last = (cs.get("lastState") or {}).get("terminated") or {}
        text = f"the container keeps exiting; last exit: {last.get('reason') or 'unknown'}"
        if last.get("exitCode") is not None:
            text += f", exit code {last['exitCode']}"
        if last.get("message"):
            text += f": {str(last['message']).strip()}"
        return text
    return str(waiting.get("message") or waiting.get("reason"))


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or
               (event.get("metadata") or {}).get("creationTimestamp") or "")


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def blockers_condition(blockers: Sequence[Blocker]) -> Condition:
    """PodsBlocked: True with the first blocker's reason and every blocker's own message."""
    if not blockers:
        return Condition(PODS_BLOCKED, "False", "NoBlockers", "no pod is blocked")
    shown = "; ".join(b.describe() for b in blockers[:3])
    more = f"; and {len(blockers) - 3} more (status.blockedPods)" if len(blockers) > 3 else ""
    return Condition(PODS_BLOCKED, "True", blockers[0].reason, shown + more)


def new_blockers(before: Sequence[Mapping[str, Any]] | None, after: Sequence[Blocker]) -> list[Blocker]:
    """Blockers not already recorded (same pod, container and reason): each gets one Event."""
    seen = {(str(b.get("pod", "")), str(b.get("container", "")), str(b.get("reason", ""))) for b in before or ()}
    return [b for b in after if b.key not in seen]


@dataclass(frozen=True)
class TrackHealth:
    """A running track's pods: container restarts so far, what is wrong now (empty: nothing), and
    which pods are ready and which are not (a pod that is not ready yet may still be starting)."""

    restarts: int
    problem: str
    ready: tuple[str, ...] = ()
    unready: tuple[str, ...] = ()


def track_health(pods: Iterable[Mapping[str, Any]]) -> TrackHealth:
    """Restarts of every container, crash loops and exited containers, and each pod's readiness.

    Pods being deleted are left out (a scale-down or a rollout replaces them on purpose). An
    unready pod is no problem by itself: a canary grows with its weight, and new pods load first;
    the rollout compares readiness with the pods it saw ready before (rollout.machine).
    """
    restarts, problems, ready, unready = 0, [], [], []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = meta.get("name", "")
        for cs in status.get("containerStatuses") or ():
            restarts += int(cs.get("restartCount") or 0)
            state = cs.get("state") or {}
            waiting, terminated = state.get("waiting") or {}, state.get("terminated")
            if waiting.get("reason") in WAITING_REASONS:
                problems.append(f"pod {name} container {cs.get('name')}: {waiting['reason']}: "
                                f"{_waiting_message(cs, waiting)}")
            elif terminated:
                problems.append(f"pod {name} container {cs.get('name')} exited: {terminated.get('reason') or ''} "
                                f"exit code {terminated.get('exitCode')}")
        cond = next((x for x in status.get("conditions") or () if x.get("type") == "Ready"), None)
        (ready if cond is not None and cond.get("status") == "True" else unready).append(name)
    return TrackHealth(restarts, _clip("; ".join(problems)), tuple(sorted(ready)), tuple(sorted(unready)))
