"""The machine's inputs and memory as typed values; `.status.canary` round-trips through CanaryStatus."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from kvpilot.operator.rollout.phases import IDLE


class Verdict(Protocol):
    """An analysis result as the machine reads it (kvpilot.operator.analysis's AnalysisResult)."""

    verdict: str  # pass | fail | inconclusive
    reason: str
    message: str

    def to_status(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RolloutSpec:
    """What the user asked for, reduced to what the machine decides on."""

    spec_hash: str | None  # None: no spec.canary
    steps: tuple[int, ...] = (1, 5, 100)
    interval_s: float = 300.0
    failure_limit: int = 2
    paused: bool = False
    rollback: bool = False  # spec.rollback or the kvpilot.io/rollback=true annotation
    promote: str | None = None  # kvpilot.io/promote annotation: acts when it names status.specHash
    abort: str | None = None  # kvpilot.io/abort annotation: acts when it names status.specHash
    replicas: int = 1
    strategy: str = ""  # the canary's strategy name, for messages


@dataclass(frozen=True)
class World:
    """What the controller observed this tick (the machine never looks itself)."""

    canary_feasible: bool = True
    canary_message: str = ""
    canary_ready: bool = True
    router_available: bool = True
    router_message: str = ""
    stable_promoted: bool = True  # the stable Deployment runs the promoted configuration, all ready
    has_previous: bool = True  # the lineage holds a previous stable to roll back to
    canary_restarts: int = -1  # container restarts of the canary's pods now (-1: not looked at)
    canary_problem: str = ""  # a canary pod crash-looping or exited (empty: healthy)
    canary_ready_pods: tuple[str, ...] | None = None  # canary pods ready now (None: not looked at)
    canary_unready_pods: tuple[str, ...] = ()  # ... and not ready (starting, or gone unready)


_KEYS = {"phase": "phase", "spec_hash": "specHash", "step": "step", "weight": "weight",
         "step_started_at": "stepStartedAt", "started_at": "startedAt", "failures": "failures",
         "reason": "reason", "message": "message", "promoted": "promoted",
         "restarts_at_start": "restartsAtStart", "ready_pods": "readyPods"}


@dataclass(frozen=True)
class CanaryStatus:
    """`.status.canary`: everything a restarted operator needs to resume exactly."""

    phase: str = IDLE
    spec_hash: str | None = None
    step: int = -1
    weight: int = 0
    step_started_at: str | None = None
    started_at: str | None = None
    failures: int = 0
    analyses: tuple[dict[str, Any], ...] = ()
    reason: str = ""
    message: str = ""
    promoted: bool = False  # the Promote action was applied for this spec hash
    restarts_at_start: int = -1  # the canary's container restarts when its first step began (-1: unknown)
    ready_pods: tuple[str, ...] = ()  # canary pods seen ready while it carried traffic (one going unready: a crash)
    extra: Mapping[str, Any] = field(default_factory=dict)  # fields the machine does not own

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> CanaryStatus:
        raw = dict(raw or {})
        values: dict[str, Any] = {}
        for attr, key in _KEYS.items():
            if key in raw:
                values[attr] = raw.pop(key)
        analyses = tuple(dict(a) for a in raw.pop("analyses", None) or ())
        if "ready_pods" in values:
            values["ready_pods"] = tuple(values["ready_pods"] or ())
        return cls(**values, analyses=analyses, extra=raw)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for attr, key in _KEYS.items():
            out[key] = getattr(self, attr)
        out["analyses"] = [dict(a) for a in self.analyses]
        out["readyPods"] = list(self.ready_pods)
        return out

    def with_(self, **changes: Any) -> CanaryStatus:
        return replace(self, **changes)


def rfc3339(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
