"""Every transition of the rollout state machine, one behaviour per test."""

from __future__ import annotations

import pytest

from kvpilot.operator.rollout import (
    CanaryStatus,
    DeleteCanary,
    Event,
    Promote,
    RollbackStable,
    RolloutSpec,
    RunAnalysis,
    ScaleCanary,
    SetWeight,
    World,
    decide,
)
from kvpilot.operator.rollout import phases as p
from tests.unit.rollout_fakes import Result, at

pytestmark = pytest.mark.unit
SPEC = RolloutSpec(spec_hash="h1", steps=(1, 5, 100), interval_s=10, failure_limit=2, replicas=2, strategy="int8")


def kinds(actions: tuple) -> list[type]:
    return [type(a) for a in actions if not isinstance(a, Event)]


def started(spec: RolloutSpec = SPEC) -> CanaryStatus:
    """Progressing at step 0 with 1% routed, started at t=0."""
    status = decide(CanaryStatus(), spec, None, at(0)).status
    return decide(status, spec, None, at(0)).status


def test_no_canary_spec_stays_idle_with_no_actions() -> None:
    decision = decide(CanaryStatus(), RolloutSpec(spec_hash=None), None, at(0))
    assert decision.status == CanaryStatus() and decision.actions == ()


def test_new_canary_creates_the_track_and_waits_for_its_pods() -> None:
    decision = decide(CanaryStatus(), SPEC, None, at(0), World(canary_ready=False))
    assert decision.status.phase == p.PROGRESSING and decision.status.spec_hash == "h1"
    assert (decision.status.step, decision.status.weight, decision.status.step_started_at) == (0, 0, None)
    assert kinds(decision.actions) == [ScaleCanary] and decision.actions[0] == ScaleCanary(2)
    waiting = decide(decision.status, SPEC, None, at(1), World(canary_ready=False, canary_message="0/2 ready"))
    assert waiting.status.reason == "CanaryNotReady" and kinds(waiting.actions) == []
    again = decide(waiting.status, SPEC, None, at(2), World(canary_ready=False, canary_message="0/2 ready"))
    assert again.status == waiting.status and again.actions == ()


def test_ready_canary_gets_the_first_step_weight() -> None:
    status = decide(CanaryStatus(), SPEC, None, at(0)).status
    decision = decide(status, SPEC, None, at(3))
    assert decision.status.weight == 1 and decision.status.step_started_at == "2026-01-01T00:00:03Z"
    assert SetWeight(1) in decision.actions


def test_without_gateway_api_the_rollout_waits_and_says_why() -> None:
    status = decide(CanaryStatus(), SPEC, None, at(0)).status
    world = World(router_available=False, router_message="HTTPRoute CRD not installed")
    decision = decide(status, SPEC, None, at(1), world)
    assert decision.status.weight == 0 and decision.status.reason == "TrafficSplitUnavailable"
    assert Event("Warning", "TrafficSplitUnavailable", "HTTPRoute CRD not installed") in decision.actions
    assert kinds(decision.actions) == []


def test_same_spec_reapplied_changes_nothing() -> None:
    status = started()
    decision = decide(status, SPEC, None, at(5))
    assert decision.status == status and decision.actions == ()


def test_interval_elapsed_requests_an_analysis() -> None:
    decision = decide(started(), SPEC, None, at(10))
    assert decision.status.phase == p.ANALYSING
    assert decision.actions == (RunAnalysis(step=0, weight=1, window_s=10),)


def test_unanswered_analysis_is_requested_again_after_a_restart() -> None:
    analysing = decide(started(), SPEC, None, at(10)).status
    decision = decide(analysing, SPEC, None, at(30))
    assert decision.status == analysing and decision.actions == (RunAnalysis(0, 1, 10),)


def test_pass_moves_to_the_next_step_and_records_the_figures() -> None:
    analysing = decide(started(), SPEC, None, at(10)).status
    decision = decide(analysing, SPEC, Result("pass"), at(11))
    status = decision.status
    assert (status.phase, status.step, status.weight) == (p.PROGRESSING, 1, 5)
    assert status.analyses[-1]["verdict"] == "pass" and status.analyses[-1]["step"] == 0
    assert status.analyses[-1]["checks"][0]["name"] == "ttft_p95_ratio"
    assert SetWeight(5) in decision.actions


def test_pass_before_a_100_step_promotes_then_completes_when_stable_is_rolled() -> None:
    status = started()
    for t, step in ((10, 0), (21, 1)):
        status = decide(status, SPEC, None, at(t)).status
        assert status.step == step
        status = decide(status, SPEC, Result("pass"), at(t + 1)).status
    assert (status.phase, status.weight, status.step) == (p.PROMOTING, 5, 2)  # the last step's weight, held
    waiting = decide(status, SPEC, None, at(40), World(stable_promoted=False))
    assert waiting.status == status and waiting.actions == ()
    done = decide(status, SPEC, None, at(41))
    assert (done.status.phase, done.status.weight) == (p.PROMOTED, 0)
    assert kinds(done.actions) == [SetWeight, DeleteCanary]


def test_promotion_holds_the_canary_at_its_last_weight_while_stable_rolls() -> None:
    """The canary is sized for its step's share: the route must not send it everything while stable rolls."""
    spec = RolloutSpec(spec_hash="h1", steps=(50,), interval_s=10, failure_limit=1)
    status = decide(started(spec), spec, None, at(10)).status
    decision = decide(status, spec, Result("pass"), at(11))
    assert kinds(decision.actions) == [Promote] and decision.status.weight == 50
    assert decision.status.promoted and "keeps 50%" in decision.status.message


@pytest.mark.parametrize("verdict", ["fail", "inconclusive"])
def test_failed_or_inconclusive_below_the_limit_retries_the_same_step(verdict: str) -> None:
    analysing = decide(started(), SPEC, None, at(10)).status
    decision = decide(analysing, SPEC, Result(verdict), at(11))
    status = decision.status
    assert (status.phase, status.step, status.weight, status.failures) == (p.PROGRESSING, 0, 1, 1)
    assert status.step_started_at == "2026-01-01T00:00:11Z"
    assert kinds(decision.actions) == []


@pytest.mark.parametrize("verdict", ["fail", "inconclusive"])
def test_failure_limit_rolls_back_to_zero(verdict: str) -> None:
    status = started()
    for t in (10, 22):
        status = decide(status, SPEC, None, at(t)).status
        decision = decide(status, SPEC, Result(verdict), at(t + 1))
        status = decision.status
    assert status.phase == p.ROLLING_BACK and status.weight == 0 and status.failures == 2
    assert kinds(decision.actions) == [SetWeight, ScaleCanary]
    assert SetWeight(0) in decision.actions and ScaleCanary(0) in decision.actions
    final = decide(status, SPEC, None, at(24))
    assert final.status.phase == p.ROLLED_BACK and final.status.weight == 0
    assert decide(final.status, SPEC, None, at(99)).actions == ()


def test_inconclusive_never_promotes_even_at_the_last_step() -> None:
    spec = RolloutSpec(spec_hash="h1", steps=(50,), interval_s=10, failure_limit=5)
    status = started(spec)
    for t in range(10, 60, 11):  # five analyses, each after a fresh window
        status = decide(status, spec, None, at(t)).status
        decision = decide(status, spec, Result("inconclusive"), at(t + 1))
        assert Promote() not in decision.actions
        status = decision.status
    assert status.phase == p.ROLLING_BACK


def test_rollback_flag_mid_rollout_is_one_route_update_and_canary_to_zero() -> None:
    status = decide(decide(started(), SPEC, None, at(10)).status, SPEC, Result("pass"), at(11)).status
    assert status.weight == 5
    flagged = RolloutSpec(**{**SPEC.__dict__, "rollback": True})
    decision = decide(status, flagged, None, at(12))
    assert [a for a in decision.actions if isinstance(a, SetWeight)] == [SetWeight(0)]
    assert ScaleCanary(0) in decision.actions and RollbackStable() not in decision.actions
    done = decide(decision.status, flagged, None, at(12))
    assert done.status.phase == p.ROLLED_BACK and done.status.reason == "RollbackRequested"
    assert any(isinstance(a, Event) and a.reason == "RolledBack" for a in done.actions)
    cleared = decide(done.status, SPEC, None, at(20))
    assert cleared.status == done.status and cleared.actions == ()


def test_new_canary_spec_after_a_rollback_starts_again_but_not_while_flagged() -> None:
    flagged = RolloutSpec(**{**SPEC.__dict__, "rollback": True})
    status = decide(decide(started(), flagged, None, at(1)).status, flagged, None, at(1)).status
    new_flagged = RolloutSpec(**{**flagged.__dict__, "spec_hash": "h2"})
    held = decide(status, new_flagged, None, at(2))
    assert held.status.phase == p.ROLLED_BACK and held.status.reason == "RollbackFlagSet"
    assert decide(held.status, new_flagged, None, at(3)).actions == ()
    new = RolloutSpec(**{**SPEC.__dict__, "spec_hash": "h2"})
    restarted = decide(held.status, new, None, at(4))
    assert restarted.status.phase == p.PROGRESSING and restarted.status.spec_hash == "h2"
    assert restarted.status.analyses == () and restarted.status.failures == 0


def test_changed_canary_mid_rollout_restarts_from_zero() -> None:
    status = decide(decide(started(), SPEC, None, at(10)).status, SPEC, Result("pass"), at(11)).status
    changed = RolloutSpec(**{**SPEC.__dict__, "spec_hash": "h2"})
    decision = decide(status, changed, None, at(12))
    assert decision.actions[0] == SetWeight(0) and ScaleCanary(2) in decision.actions
    assert (decision.status.step, decision.status.weight, decision.status.analyses) == (0, 0, ())


def test_pause_holds_the_weight_and_resume_restarts_the_window() -> None:
    paused = RolloutSpec(**{**SPEC.__dict__, "paused": True})
    status = decide(started(), paused, None, at(5)).status
    assert status.phase == p.PAUSED and status.weight == 1
    assert decide(status, paused, None, at(500)).actions == ()
    resumed = decide(status, SPEC, None, at(600)).status
    assert resumed.phase == p.PROGRESSING and resumed.step_started_at == "2026-01-01T00:10:00Z"
    assert decide(resumed, SPEC, None, at(605)).actions == ()


def test_manual_promote_skips_steps_and_forces_past_a_pause() -> None:
    paused = RolloutSpec(**{**SPEC.__dict__, "paused": True, "promote": "h1"})
    status = decide(started(), RolloutSpec(**{**SPEC.__dict__, "paused": True}), None, at(5)).status
    decision = decide(status, paused, None, at(6))
    assert decision.status.phase == p.PROMOTING and Promote() in decision.actions
    stale = RolloutSpec(**{**SPEC.__dict__, "promote": "old-hash"})
    assert decide(started(), stale, None, at(5)).actions == ()


def test_abort_rolls_the_canary_back_only_for_its_own_spec() -> None:
    aborted = decide(started(), RolloutSpec(**{**SPEC.__dict__, "abort": "h1"}), None, at(5))
    assert aborted.status.phase == p.ROLLING_BACK and aborted.status.reason == "Aborted"
    assert decide(started(), RolloutSpec(**{**SPEC.__dict__, "abort": "zz"}), None, at(5)).actions == ()


def test_rollback_during_promotion_also_restores_stable() -> None:
    status = decide(started(), RolloutSpec(**{**SPEC.__dict__, "promote": "h1"}), None, at(5)).status
    assert status.phase == p.PROMOTING
    decision = decide(status, RolloutSpec(**{**SPEC.__dict__, "rollback": True}), None, at(6))
    assert kinds(decision.actions) == [SetWeight, ScaleCanary, RollbackStable]


def test_flag_after_promotion_rolls_stable_back_once() -> None:
    status = decide(started(), RolloutSpec(**{**SPEC.__dict__, "promote": "h1"}), None, at(5)).status
    status = decide(status, SPEC, None, at(6)).status
    assert status.phase == p.PROMOTED
    flagged = RolloutSpec(**{**SPEC.__dict__, "rollback": True})
    decision = decide(status, flagged, None, at(7))
    assert decision.status.phase == p.ROLLED_BACK and RollbackStable() in decision.actions
    assert decide(decision.status, flagged, None, at(8)).actions == ()
    assert decide(decision.status, SPEC, None, at(9)).actions == ()


def test_flag_after_promotion_works_when_spec_canary_was_removed() -> None:
    status = decide(started(), RolloutSpec(**{**SPEC.__dict__, "promote": "h1"}), None, at(5)).status
    status = decide(status, SPEC, None, at(6)).status
    gone = RolloutSpec(spec_hash=None)
    assert decide(status, gone, None, at(7)).actions == ()
    decision = decide(status, RolloutSpec(spec_hash=None, rollback=True), None, at(8))
    assert RollbackStable() in decision.actions
    assert decide(status, RolloutSpec(spec_hash=None, rollback=True), None, at(8),
                  World(has_previous=False)).status.reason == "NoPrevious"


def test_infeasible_canary_is_refused_before_any_pod() -> None:
    world = World(canary_feasible=False, canary_message="KV pool 0 B: weights do not fit")
    decision = decide(CanaryStatus(), SPEC, None, at(0), world)
    assert decision.status.phase == p.FAILED and decision.status.reason == "CanaryInfeasible"
    assert kinds(decision.actions) == []
    assert decide(decision.status, SPEC, None, at(1), world).actions == ()


def test_removing_spec_canary_mid_rollout_stops_it() -> None:
    decision = decide(started(), RolloutSpec(spec_hash=None), None, at(3))
    assert decision.status == CanaryStatus()
    assert kinds(decision.actions) == [SetWeight, DeleteCanary]


def test_status_round_trips_through_the_status_document() -> None:
    status = decide(decide(started(), SPEC, None, at(10)).status, SPEC, Result("fail"), at(11)).status
    doc = {**status.to_dict(), "unowned": 1}
    assert CanaryStatus.from_dict(doc) == status.with_(extra={"unowned": 1})
    assert CanaryStatus.from_dict(doc).to_dict() == doc


def test_a_crashing_canary_rolls_back_before_its_window_ends() -> None:
    status = decide(CanaryStatus(), SPEC, None, at(0)).status
    status = decide(status, SPEC, None, at(0), World(canary_restarts=0)).status
    assert status.restarts_at_start == 0 and status.weight == 1
    calm = decide(status, SPEC, None, at(2), World(canary_restarts=0))
    assert calm.status == status and calm.actions == ()
    crashed = decide(status, SPEC, None, at(3), World(canary_restarts=0, canary_problem="pod x: CrashLoopBackOff"))
    assert crashed.status.phase == p.ROLLING_BACK and crashed.status.reason == "CanaryCrashed"
    assert "CrashLoopBackOff" in crashed.status.message
    assert SetWeight(0) in crashed.actions and ScaleCanary(0) in crashed.actions
    restarted = decide(status, SPEC, None, at(3), World(canary_restarts=1))
    assert restarted.status.reason == "CanaryCrashed" and "restarted 1 time" in restarted.status.message


def test_a_canary_not_yet_routed_is_not_judged_by_its_start() -> None:
    status = decide(CanaryStatus(), SPEC, None, at(0), World(canary_ready=False)).status
    waiting = decide(status, SPEC, None, at(1), World(canary_ready=False, canary_restarts=3,
                                                        canary_problem="pod x is not ready: loading"))
    assert waiting.status.phase == p.PROGRESSING and waiting.status.reason == "CanaryNotReady"
