"""One tick of an InferenceService's rollout: observe, decide, apply, persist; analyses off the lock.

Per object, ticks take turns (a lock), except while an analysis runs: the lock is released for
it, so a rollback flag set meanwhile acts at once; the analysis's result is then dropped
because the status moved on (phase, step or analysis count differ).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator import operator_metrics as metrics
from kvpilot.operator.context import Context
from kvpilot.operator.kube import object_path
from kvpilot.operator.options import Options
from kvpilot.operator.rollout import CanaryStatus, Decision, RunAnalysis, decide
from kvpilot.operator.rollout import phases as p
from kvpilot.operator.rollout.analysis_runner import run_analysis
from kvpilot.operator.rollout.apply import apply_action
from kvpilot.operator.rollout.locks import object_lock
from kvpilot.operator.rollout.observe import Observation, observe
from kvpilot.operator.rollout.state import Verdict
from kvpilot.operator.routing.httproute import build_httproute, route_name, route_path
from kvpilot.operator.status.conditions import Condition
from kvpilot.operator.status.document import with_conditions
from kvpilot.operator.status.writer import write_status

CANARY, TRAFFIC_SPLIT = "Canary", "TrafficSplit"
MAX_ROUNDS = 8  # decisions per tick before handing back (each one a real transition)

Analyser = Callable[[Mapping[str, Any], RunAnalysis, datetime.datetime], Verdict]
Clock = Callable[[], datetime.datetime]

_analysing: set[tuple[str, str]] = set()  # objects with an analysis in flight (one at a time each)
_analysing_guard = threading.Lock()


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def tick(ctx: Context, namespace: str, name: str, options: Options, *, clock: Clock = utc_now,
         analyser: Analyser | None = None) -> CanaryStatus | None:
    """Advance one rollout as far as it goes now; returns the persisted status (None: object gone)."""
    def default_analyser(body: Mapping[str, Any], request: RunAnalysis, now: datetime.datetime) -> Verdict:
        return run_analysis(ctx.kube, body, request, options, now)

    analyser = analyser or default_analyser
    result: Verdict | None = None
    for _ in range(MAX_ROUNDS):
        with object_lock(namespace, name):
            body = ctx.kube.get(object_path(c.API_VERSION, c.KIND, namespace, name))
            if body is None:
                return None
            status, request = _advance(ctx, body, options, clock, result)
        if request is None:
            return status
        with _analysing_guard:
            if (namespace, name) in _analysing:  # another tick is judging this step already
                return status
            _analysing.add((namespace, name))
        asked = (status.spec_hash, status.step, len(status.analyses))
        try:
            result = analyser(body, request, clock())  # the slow part, with the lock released
        finally:
            with _analysing_guard:
                _analysing.discard((namespace, name))
        with object_lock(namespace, name):
            fresh = ctx.kube.get(object_path(c.API_VERSION, c.KIND, namespace, name))
            now_status = CanaryStatus.from_dict(((fresh or {}).get("status") or {}).get("canary"))
        if now_status.phase != p.ANALYSING or (now_status.spec_hash, now_status.step,
                                                len(now_status.analyses)) != asked:
            result = None  # superseded (rollback, pause, new spec): the verdict is for a rollout that moved on
    return None


def _advance(ctx: Context, body: dict[str, Any], options: Options, clock: Clock,
             result: Verdict | None) -> tuple[CanaryStatus, RunAnalysis | None]:
    """Decide and apply until the status settles or an analysis is needed."""
    meta = body["metadata"]
    status = CanaryStatus.from_dict((body.get("status") or {}).get("canary"))
    for _ in range(MAX_ROUNDS):
        obs = observe(ctx.kube, body, status, options)
        decision = decide(status, obs.spec, result, clock(), obs.world)
        result = None
        for action in decision.actions:
            if not isinstance(action, RunAnalysis):
                apply_action(ctx, body, obs, action)
        request = next((a for a in decision.actions if isinstance(a, RunAnalysis)), None)
        if decision.status != status or _conditions_stale(body, obs, decision):
            body = _persist(ctx, body, obs, status, decision) or body
        settled = decision.status == status
        status = decision.status
        if request is not None or settled:
            _refresh_route(ctx, body, obs, status)
            _record_metrics(meta["namespace"], meta["name"], status)
            return status, request
    _record_metrics(meta["namespace"], meta["name"], status)
    return status, None


def _refresh_route(ctx: Context, body: Mapping[str, Any], obs: Observation, status: CanaryStatus) -> None:
    """A spec.route edit (hostnames, model header, Gateway) mid-rollout: the route follows at once
    with the weight it holds, instead of at the next step."""
    if status.phase not in p.ACTIVE or obs.target is None or obs.router is None:
        return
    wanted = build_httproute(body, obs.target, status.weight)["spec"]
    live = ctx.kube.get(route_path(body["metadata"]["namespace"], route_name(body["metadata"]["name"])))
    if live is None:
        return  # nothing routed yet: the machine's first SetWeight creates it
    have = live.get("spec") or {}
    if (have.get("hostnames") or [], have.get("parentRefs"), _matches(have)) != (
            wanted.get("hostnames") or [], wanted["parentRefs"], _matches(wanted)):
        obs.router.set_weight(ctx.kube, body, obs.target, status.weight)


def _matches(route_spec: Mapping[str, Any]) -> list[Any]:
    return [[m.get("headers") or [] for m in r.get("matches") or []] for r in route_spec.get("rules") or []]


def _conditions_stale(body: Mapping[str, Any], obs: Observation, decision: Decision) -> bool:
    wanted = {cond.type: (cond.status, cond.reason) for cond in _conditions(obs, decision.status)}
    have = {cnd.get("type"): (cnd.get("status"), cnd.get("reason"))
            for cnd in (body.get("status") or {}).get("conditions") or ()}
    return any(have.get(t) != v for t, v in wanted.items())


def _conditions(obs: Observation, status: CanaryStatus) -> list[Condition]:
    if status.phase == p.IDLE and obs.spec.spec_hash is None:
        return []
    active = status.phase in p.ACTIVE
    out = [Condition(CANARY, "True" if active else "False", status.reason or status.phase,
                     status.message or status.phase)]
    ok, reason, message = obs.router_ok
    if obs.spec.spec_hash is not None:
        out.append(Condition(TRAFFIC_SPLIT, "True" if ok else "False", reason or "Unknown", message or reason))
    return out


def _persist(ctx: Context, body: Mapping[str, Any], obs: Observation, old: CanaryStatus,
             decision: Decision) -> dict[str, Any] | None:
    meta = body["metadata"]
    doc = decision.status.to_dict()
    if obs.spec.strategy:
        doc["strategy"] = obs.spec.strategy
    now = utc_now().strftime("%Y-%m-%dT%H:%M:%SZ")

    def update(_live: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
        new = {**current, "canary": doc}
        return with_conditions(new, _conditions(obs, decision.status), now=now,
                               generation=current.get("observedGeneration"))

    write_status(ctx.kube, meta["namespace"], meta["name"], update)
    _count(meta["namespace"], meta["name"], old, decision.status)
    _record_metrics(meta["namespace"], meta["name"], decision.status)
    return ctx.kube.get(object_path(c.API_VERSION, c.KIND, meta["namespace"], meta["name"]))


def _count(namespace: str, name: str, old: CanaryStatus, new: CanaryStatus) -> None:
    if new.phase == old.phase:
        return
    if new.phase == p.PROMOTED:
        metrics.PROMOTIONS.labels(namespace, name).inc()
    elif new.phase == p.ROLLING_BACK or (new.phase == p.ROLLED_BACK and old.phase == p.PROMOTED):
        metrics.ROLLBACKS.labels(namespace, name, new.reason or "Unknown").inc()


def _record_metrics(namespace: str, name: str, status: CanaryStatus) -> None:
    metrics.record_status(namespace, name, status.phase, status.step, status.weight)
