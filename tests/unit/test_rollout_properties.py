"""Invariants of the rollout state machine over generated sequences of results, edits and restarts.

A small driver plays the controller: it calls `decide` until the status settles, applies the
route updates to a simulated route and answers an analysis only when one was asked for.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.operator.rollout import (
    CanaryStatus,
    Promote,
    RolloutSpec,
    RunAnalysis,
    SetWeight,
    World,
    decide,
)
from kvpilot.operator.rollout import phases as p
from tests.unit.rollout_fakes import Result, at

pytestmark = pytest.mark.unit
STEP_LISTS = [(1, 5, 100), (10, 50), (100,), (1, 2, 3, 4), (25, 100)]

events = st.one_of(
    st.tuples(st.just("tick"), st.integers(0, 40)),
    st.tuples(st.just("result"), st.sampled_from(["pass", "pass", "fail", "inconclusive"])),
    st.tuples(st.just("edit"), st.sampled_from(["h1", "h2", None]), st.sampled_from(STEP_LISTS)),
    st.tuples(st.just("flag"), st.booleans()),
    st.tuples(st.just("pause"), st.booleans()),
    st.tuples(st.just("promote")),
    st.tuples(st.just("abort")),
    st.tuples(st.just("world"), st.booleans(), st.booleans(), st.booleans()),
    st.tuples(st.just("restart")),
)


@dataclass
class Sim:
    spec: RolloutSpec
    status: CanaryStatus = field(default_factory=CanaryStatus)
    world: World = field(default_factory=World)
    now: datetime.datetime = field(default_factory=lambda: at(0))
    route: int = 0
    pending: RunAnalysis | None = None

    def settle(self, result: Result | None = None) -> None:
        for _ in range(6):
            old = self.status
            decision = decide(old, self.spec, result, self.now, self.world)
            check_transition(old, decision.status, decision.actions, self.spec, result)
            for action in decision.actions:
                if isinstance(action, SetWeight):
                    self.route = action.weight
            self.pending = next((a for a in decision.actions if isinstance(a, RunAnalysis)), None)
            self.status, result = decision.status, None
            assert self.route == self.status.weight, (self.route, self.status)
            if self.status == old or self.pending is not None:
                return
        raise AssertionError(f"did not settle: {self.status}")


def check_transition(old: CanaryStatus, new: CanaryStatus, actions: tuple, spec: RolloutSpec,
                     result: Result | None) -> None:
    allowed = {0, 100, *spec.steps}
    assert new.weight in allowed, f"weight {new.weight} not in {sorted(allowed)}"
    same = old.spec_hash == new.spec_hash and new.spec_hash is not None
    if same and new.weight != old.weight and new.weight not in (0, 100):
        assert new.weight == spec.steps[new.step]
        assert new.step == old.step + 1 or (old.weight == 0 and new.step == old.step), (old, new)
    if any(isinstance(a, Promote) for a in actions):
        passed = result is not None and result.verdict == "pass" and new.analyses[-1]["verdict"] == "pass"
        assert passed or spec.promote == new.spec_hash, "promoted without a pass"
    if new.phase in (p.ROLLING_BACK, p.ROLLED_BACK):
        assert new.weight == 0
    if new.phase == p.ROLLING_BACK and old.phase != p.ROLLING_BACK:
        assert SetWeight(0) in actions and [a for a in actions if isinstance(a, SetWeight)] == [SetWeight(0)]
    if same:
        grew = len(new.analyses) - len(old.analyses)
        assert grew == (1 if result is not None and old.phase == p.ANALYSING and new.phase != p.PAUSED
                        and spec.promote != old.spec_hash and not spec.rollback
                        and spec.abort != old.spec_hash else 0), (old, new, result)
        if new.failures >= spec.failure_limit:
            assert new.phase in (p.ROLLING_BACK, p.ROLLED_BACK) or new.promoted


def check_restart(sim: Sim) -> None:
    """Deciding again from the persisted status at the same instant replays nothing."""
    decision = decide(sim.status, sim.spec, None, sim.now, sim.world)
    if sim.status.phase == p.ROLLING_BACK:  # crashed between the route update and the write
        assert decision.status.phase == p.ROLLED_BACK and decision.status.weight == 0
        return
    assert decision.status == sim.status, (sim.status, decision.status)
    expected = (RunAnalysis(sim.status.step, sim.status.weight, sim.spec.interval_s),)
    assert decision.actions == (expected if sim.status.phase == p.ANALYSING else ())


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=40), st.integers(1, 3), st.sampled_from(STEP_LISTS))
def test_invariants_hold_for_any_sequence(seq: list[tuple], failure_limit: int, steps: tuple[int, ...]) -> None:
    sim = Sim(RolloutSpec(spec_hash="h1", steps=steps, interval_s=10, failure_limit=failure_limit, replicas=1))
    sim.settle()
    for event in seq:
        kind = event[0]
        result = None
        if kind == "tick":
            sim.now += datetime.timedelta(seconds=event[1])
        elif kind == "result":
            if sim.pending is None:
                continue
            result = Result(event[1])
        elif kind == "edit":
            # the steps are part of spec.canary, so of its hash
            if event[1] is None:
                sim.spec = replace(sim.spec, spec_hash=None)
            else:
                sim.spec = replace(sim.spec, spec_hash=f"{event[1]}{event[2]}", steps=event[2])
        elif kind == "flag":
            sim.spec = replace(sim.spec, rollback=event[1])
        elif kind == "pause":
            sim.spec = replace(sim.spec, paused=event[1])
        elif kind == "promote":
            sim.spec = replace(sim.spec, promote=sim.status.spec_hash)
        elif kind == "abort":
            sim.spec = replace(sim.spec, abort=sim.status.spec_hash)
        elif kind == "world":
            sim.world = World(canary_ready=event[1], router_available=event[2], stable_promoted=event[3])
        elif kind == "restart":
            check_restart(sim)
            sim.status = CanaryStatus.from_dict(sim.status.to_dict())  # only what was persisted survives
            continue
        sim.settle(result)
        check_restart(sim)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["pass", "fail", "inconclusive"]), min_size=1, max_size=12),
       st.integers(1, 3))
def test_a_rollout_ends_promoted_only_after_every_step_passed(verdicts: list[str], failure_limit: int) -> None:
    spec = RolloutSpec(spec_hash="h1", steps=(1, 5, 100), interval_s=10, failure_limit=failure_limit)
    sim = Sim(spec)
    sim.settle()
    weights = [sim.route]
    for verdict in verdicts:
        sim.now += datetime.timedelta(seconds=10)
        sim.settle()
        if sim.pending is None:
            break
        sim.settle(Result(verdict))
        weights.append(sim.route)
    passes = [a["verdict"] for a in sim.status.analyses]
    if sim.status.phase in (p.PROMOTING, p.PROMOTED):
        assert passes.count("pass") == 2 and passes[-1] == "pass"
    failures = len(passes) - passes.count("pass")
    assert failures == sim.status.failures
    if failures >= failure_limit:
        assert sim.status.phase == p.ROLLED_BACK and sim.route == 0
    rising = [w for w in weights if w]
    assert rising == sorted(rising), weights
