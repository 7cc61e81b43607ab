"""Which objects the rollout's kopf handlers act on (the filters; the actions are the controller's)."""

from __future__ import annotations

import datetime

import pytest

from kvpilot.operator.handlers.rollout_ticks import annotation_pending, needs_ticks, waiting_out_a_step
from kvpilot.operator.spec import canary_hash

pytestmark = pytest.mark.unit
CANARY = {"strategy": {"kvCacheDtype": "int8"}, "steps": [1, 5, 100]}


def status(phase: str, spec_hash: str = "h1") -> dict:
    return {"canary": {"phase": phase, "specHash": spec_hash}}


def test_timer_runs_for_a_new_canary_and_active_rollouts_only() -> None:
    assert needs_ticks(spec={"canary": CANARY}, status={})
    assert needs_ticks(spec={"canary": CANARY}, status=status("Analysing", canary_hash(CANARY)))
    assert not needs_ticks(spec={"canary": CANARY}, status=status("Promoted", canary_hash(CANARY)))
    assert needs_ticks(spec={"canary": {**CANARY, "steps": [1, 100]}}, status=status("Promoted", canary_hash(CANARY)))
    assert not needs_ticks(spec={}, status={})


def test_rollback_annotation_acts_during_a_rollout_and_after_a_promotion_until_handled() -> None:
    flagged = {"annotations": {"kvpilot.io/rollback": "true"}}
    assert annotation_pending(meta=flagged, status=status("Progressing"))
    assert annotation_pending(meta=flagged, status=status("Promoted"))
    assert not annotation_pending(meta=flagged, status=status("RolledBack"))
    assert not annotation_pending(meta={"annotations": {"kvpilot.io/rollback": "false"}}, status=status("Promoted"))


def test_promote_and_abort_act_only_on_the_rollout_they_name() -> None:
    assert annotation_pending(meta={"annotations": {"kvpilot.io/promote": "h1"}}, status=status("Paused"))
    assert not annotation_pending(meta={"annotations": {"kvpilot.io/promote": "h0"}}, status=status("Paused"))
    assert not annotation_pending(meta={"annotations": {"kvpilot.io/promote": "h1"}}, status=status("Promoting"))
    assert annotation_pending(meta={"annotations": {"kvpilot.io/abort": "h1"}}, status=status("Analysing"))
    assert not annotation_pending(meta={"annotations": {"kvpilot.io/abort": "h1"}}, status=status("RolledBack"))


def test_a_tick_inside_a_steps_window_costs_nothing_and_one_at_its_end_does_the_work() -> None:
    raw = {**CANARY, "interval": "10s"}
    body = {"spec": {"canary": raw}, "status": {"canary": {
        "phase": "Progressing", "specHash": canary_hash(raw), "stepStartedAt": "2026-01-01T00:00:00Z"}}}
    at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    assert waiting_out_a_step(body, at + datetime.timedelta(seconds=9))
    assert not waiting_out_a_step(body, at + datetime.timedelta(seconds=10))
    flagged = {**body, "metadata": {"annotations": {"kvpilot.io/rollback": "true"}}}
    assert not waiting_out_a_step(flagged, at)
    assert not waiting_out_a_step({**body, "spec": {"canary": raw, "rollback": True}}, at)
    edited = {**body, "spec": {"canary": {**raw, "steps": [1, 100]}}}
    assert not waiting_out_a_step(edited, at)
    assert not waiting_out_a_step({**body, "status": {"canary": {"phase": "Analysing"}}}, at)
