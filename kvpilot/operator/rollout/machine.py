"""decide(status, spec, result, now, world) -> Decision(status, actions). Pure: no clock, no I/O.

The controller applies the actions and then persists the status, so a crash between the two
re-runs the same (idempotent) actions on restart, and a decision taken again on the persisted
status at the same instant changes nothing: a restart replays no step and no analysis.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import kvpilot.operator.rollout.phases as p
from kvpilot.operator.rollout.actions import (
    Action,
    DeleteCanary,
    Event,
    Promote,
    RollbackStable,
    RunAnalysis,
    ScaleCanary,
    SetWeight,
)
from kvpilot.operator.rollout.state import CanaryStatus, RolloutSpec, Verdict, World, parse_time, rfc3339

FULL = 100


@dataclass(frozen=True)
class Decision:
    """The next status and what to do to get there (in order)."""

    status: CanaryStatus
    actions: tuple[Action, ...] = ()


def decide(status: CanaryStatus, spec: RolloutSpec, result: Verdict | None, now: datetime.datetime,
           world: World | None = None) -> Decision:
    world = world or World()
    if spec.spec_hash is None:
        return _no_canary(status, spec, now, world)
    same = spec.spec_hash == status.spec_hash
    if status.phase in p.ACTIVE and status.phase != p.ROLLING_BACK:
        if spec.rollback:
            return _roll_back(status, "RollbackRequested", "the rollback flag is set (spec.rollback or "
                              "annotation kvpilot.io/rollback=true)")
        if same and spec.abort == status.spec_hash:
            return _roll_back(status, "Aborted", "aborted by the kvpilot.io/abort annotation")
    if not same:
        return _new_canary(status, spec, now, world)
    crash = _crash(status, world)
    if crash:
        return _roll_back(status, "CanaryCrashed", f"the canary crashed at step {status.step} "
                          f"({status.weight}%): {crash}; rolled back at once, not at the window's end")
    handler = _HANDLERS.get(status.phase)
    if handler is None:
        return Decision(status)
    return _remember_ready(handler(status, spec, result, now, world), world)


def _remember_ready(decision: Decision, world: World) -> Decision:
    """Record which canary pods are ready while it carries traffic: one of them going unready later
    is a crash; a pod that was never ready (a new one of a growing canary) is only starting."""
    status = decision.status
    if (world.canary_ready_pods is None or status.step_started_at is None
            or status.phase not in (p.PROGRESSING, p.ANALYSING, p.PAUSED)):
        return decision
    ready = tuple(sorted(world.canary_ready_pods))
    if ready == status.ready_pods:
        return decision
    return Decision(status.with_(ready_pods=ready), decision.actions)


def _crash(status: CanaryStatus, world: World) -> str:
    """What is wrong with a canary that carries (or is about to carry) traffic; empty when nothing."""
    if status.phase not in (p.PROGRESSING, p.ANALYSING, p.PAUSED) or status.step_started_at is None:
        return ""
    if world.canary_problem:
        return world.canary_problem
    gone = [pod for pod in status.ready_pods if pod in world.canary_unready_pods]
    if gone:
        return f"pod(s) {', '.join(gone)} went unready after serving (readiness probe failing)"
    if world.canary_restarts > status.restarts_at_start >= 0:
        return (f"its containers restarted {world.canary_restarts - status.restarts_at_start} time(s) "
                "since its first step")
    return ""


def _no_canary(status: CanaryStatus, spec: RolloutSpec, now: datetime.datetime, world: World) -> Decision:
    """spec.canary removed: stop what runs, forget the rollout (re-adding the same spec starts anew).

    A promotion stays on record, so the rollback flag still restores the previous stable after the
    user removed spec.canary (or folded it into spec.strategy).
    """
    if status.phase == p.IDLE and status.spec_hash is None:
        return Decision(status)
    if status.phase == p.PROMOTED:
        return _promoted(status, spec, None, now, world)
    if status.phase == p.ROLLED_BACK and status.promoted:
        return Decision(status)
    actions: list[Action] = []
    if status.weight:
        actions.append(SetWeight(0))
    if status.phase not in (p.IDLE, p.PROMOTED):
        actions.append(DeleteCanary())
    if status.phase in p.ACTIVE:
        actions.append(Event("Normal", "CanaryRemoved", f"spec.canary was removed during {status.phase}; "
                             "all traffic to stable, canary deleted"))
    return Decision(CanaryStatus(extra=status.extra), tuple(actions))


def _new_canary(status: CanaryStatus, spec: RolloutSpec, now: datetime.datetime, world: World) -> Decision:
    if spec.rollback:
        message = ("a new spec.canary is waiting: the rollback flag is set; clear spec.rollback and the "
                   "kvpilot.io/rollback annotation to start it")
        if status.message == message:
            return Decision(status)
        return Decision(status.with_(reason="RollbackFlagSet", message=message),
                        (Event("Warning", "RollbackFlagSet", message),))
    actions: list[Action] = []
    if status.weight:
        actions.append(SetWeight(0))
    restarted = status.phase in p.ACTIVE
    if not world.canary_feasible:
        if status.phase in p.ACTIVE:
            actions.append(ScaleCanary(0))
        message = f"canary refused before any pod: {world.canary_message}"
        actions.append(Event("Warning", "CanaryInfeasible", message))
        return Decision(CanaryStatus(phase=p.FAILED, spec_hash=spec.spec_hash, started_at=rfc3339(now),
                                     reason="CanaryInfeasible", message=message, extra=status.extra),
                        tuple(actions))
    verb = "restarted (spec.canary changed)" if restarted else "started"
    steps = " -> ".join(f"{w}%" for w in spec.steps)
    actions += [ScaleCanary(spec.replicas),
                Event("Normal", "CanaryStarted", f"canary {spec.strategy or spec.spec_hash} {verb}: "
                      f"steps {steps}, {spec.interval_s:g} s each, failure limit {spec.failure_limit}")]
    new = CanaryStatus(phase=p.PROGRESSING, spec_hash=spec.spec_hash, step=0, weight=0, started_at=rfc3339(now),
                       reason="CanaryStarting", message="waiting for the canary pods", extra=status.extra)
    return Decision(new, tuple(actions))


def _progressing(status: CanaryStatus, spec: RolloutSpec, _result: Verdict | None, now: datetime.datetime,
                 world: World) -> Decision:
    if spec.promote == status.spec_hash:
        return _promote(status, spec, "manual promotion (kvpilot.io/promote)")
    if spec.paused:
        return _pause(status)
    if status.step_started_at is None:
        return _start_step(status, spec, now, world)
    if (now - parse_time(status.step_started_at)).total_seconds() < spec.interval_s:
        return Decision(status)
    new = status.with_(phase=p.ANALYSING, reason="Analysing",
                       message=f"analysing step {status.step} at {status.weight}%")
    return Decision(new, (RunAnalysis(status.step, status.weight, spec.interval_s),))


def _start_step(status: CanaryStatus, spec: RolloutSpec, now: datetime.datetime, world: World) -> Decision:
    """Route traffic for the current step once the canary is ready and routing works."""
    if not world.canary_ready:
        return _wait(status, "CanaryNotReady", world.canary_message or "waiting for the canary pods")
    if not world.router_available:
        return _wait(status, "TrafficSplitUnavailable", world.router_message or "traffic splitting is unavailable")
    weight = spec.steps[status.step]
    baseline = world.canary_restarts if status.restarts_at_start < 0 else status.restarts_at_start
    new = status.with_(weight=weight, step_started_at=rfc3339(now), reason="StepStarted", restarts_at_start=baseline,
                       message=f"step {status.step}: {weight}% of traffic to the canary")
    return Decision(new, (SetWeight(weight), Event("Normal", "StepStarted", new.message)))


def _wait(status: CanaryStatus, reason: str, message: str) -> Decision:
    if (status.reason, status.message) == (reason, message):
        return Decision(status)
    return Decision(status.with_(reason=reason, message=message), (Event("Warning" if reason ==
                    "TrafficSplitUnavailable" else "Normal", reason, message),))


def _analysing(status: CanaryStatus, spec: RolloutSpec, result: Verdict | None, now: datetime.datetime,
               _world: World) -> Decision:
    if spec.promote == status.spec_hash:
        return _promote(status, spec, "manual promotion (kvpilot.io/promote)")
    if spec.paused:
        return _pause(status)
    if result is None:  # requested before a restart, never answered: ask again (it has no effects)
        return Decision(status, (RunAnalysis(status.step, status.weight, spec.interval_s),))
    record = {**result.to_status(), "step": status.step, "weight": status.weight}
    recorded = status.with_(analyses=(*status.analyses, record))
    summary = f"step {status.step} ({status.weight}%): {result.verdict}, {result.reason}: {result.message}"
    if result.verdict == "pass":
        nxt = status.step + 1
        if nxt >= len(spec.steps) or spec.steps[nxt] >= FULL:
            return _promote(recorded, spec, f"all steps passed; last: {summary}")
        new = recorded.with_(phase=p.PROGRESSING, step=nxt, weight=spec.steps[nxt], step_started_at=rfc3339(now),
                             reason="StepStarted", message=f"step {nxt}: {spec.steps[nxt]}% of traffic to the canary")
        return Decision(new, (Event("Normal", "AnalysisPassed", summary), SetWeight(spec.steps[nxt]),
                              Event("Normal", "StepStarted", new.message)))
    failures = status.failures + 1
    counted = recorded.with_(failures=failures)
    event = Event("Warning", "AnalysisFailed" if result.verdict == "fail" else "AnalysisInconclusive",
                  f"{summary} ({failures}/{spec.failure_limit})")
    if failures >= spec.failure_limit:
        decision = _roll_back(counted, "FailureLimitReached",
                              f"{failures} failed or inconclusive analyses (limit {spec.failure_limit}); last: {summary}")
        return Decision(decision.status, (event, *decision.actions))
    new = counted.with_(phase=p.PROGRESSING, step_started_at=rfc3339(now), reason=result.reason or "AnalysisFailed",
                        message=f"{event.message}; analysing step {status.step} again after {spec.interval_s:g} s")
    return Decision(new, (event,))


def _pause(status: CanaryStatus) -> Decision:
    new = status.with_(phase=p.PAUSED, reason="Paused", message=f"paused at step {status.step} ({status.weight}%)")
    return Decision(new, (Event("Normal", "Paused", new.message),))


def _paused(status: CanaryStatus, spec: RolloutSpec, _result: Verdict | None, now: datetime.datetime,
            _world: World) -> Decision:
    if spec.promote == status.spec_hash:
        return _promote(status, spec, "manual promotion past a pause (kvpilot.io/promote)")
    if spec.paused:
        return Decision(status)
    started = rfc3339(now) if status.step_started_at is not None else None
    new = status.with_(phase=p.PROGRESSING, step_started_at=started, reason="Resumed",
                       message=f"resumed at step {status.step} ({status.weight}%); the step's window starts again")
    return Decision(new, (Event("Normal", "Resumed", new.message),))


def _promote(status: CanaryStatus, spec: RolloutSpec, why: str) -> Decision:
    """The stable track takes the canary's configuration; the canary keeps its last weight meanwhile.

    The canary is sized for its last step's share (spec.canary.replicas or derived from the weight),
    so sending it all traffic while stable's pods roll would overload it; as Flagger does, the route
    stays where it is until every stable pod runs the new configuration (stable's rolling update
    surges one pod at a time, never below its replicas), and only then moves to stable."""
    new = status.with_(phase=p.PROMOTING, step=min(status.step + 1, len(spec.steps)), promoted=True,
                       reason="Promoting", message=f"promoting: {why}; stable takes the canary's configuration, "
                       f"the canary keeps {status.weight}% of traffic until every stable pod runs it")
    return Decision(new, (Promote(), Event("Normal", "Promoting", new.message)))


def _promoting(status: CanaryStatus, _spec: RolloutSpec, _result: Verdict | None, _now: datetime.datetime,
               world: World) -> Decision:
    if not world.stable_promoted:
        return Decision(status)
    new = status.with_(phase=p.PROMOTED, weight=0, reason="Promoted",
                       message="the stable track runs the canary's configuration; canary deleted")
    return Decision(new, (SetWeight(0), DeleteCanary(), Event("Normal", "Promoted", new.message)))


def _promoted(status: CanaryStatus, spec: RolloutSpec, _result: Verdict | None, _now: datetime.datetime,
              world: World) -> Decision:
    if not spec.rollback:
        return Decision(status)
    if not world.has_previous:
        return _wait(status, "NoPrevious", "rollback requested, but the lineage has no previous stable")
    new = status.with_(phase=p.ROLLED_BACK, weight=0, reason="StableRolledBack",
                       message="rollback after promotion: stable restored to the lineage's previous model and flags")
    return Decision(new, (RollbackStable(), Event("Warning", "RolledBack", new.message)))


def _roll_back(status: CanaryStatus, reason: str, message: str) -> Decision:
    """One route update to 100/0, the canary scaled to zero; RollingBack -> RolledBack next."""
    actions: list[Action] = [SetWeight(0), ScaleCanary(0)]
    if status.promoted:
        actions.append(RollbackStable())
    new = status.with_(phase=p.ROLLING_BACK, weight=0, reason=reason, message=message)
    return Decision(new, (*actions, Event("Warning", "RollingBack", message)))


def _rolling_back(status: CanaryStatus, _spec: RolloutSpec, _result: Verdict | None, _now: datetime.datetime,
                  _world: World) -> Decision:
    new = status.with_(phase=p.ROLLED_BACK, weight=0, message=f"rolled back: {status.message}")
    return Decision(new, (Event("Warning", "RolledBack", new.message),))


_HANDLERS = {
    p.PROGRESSING: _progressing,
    p.ANALYSING: _analysing,
    p.PAUSED: _paused,
    p.PROMOTING: _promoting,
    p.PROMOTED: _promoted,
    p.ROLLING_BACK: _rolling_back,
}
