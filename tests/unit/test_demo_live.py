"""The demo's live rollout view (kvpilot/demo/live.py), rendered as a terminal shows it: each check's
figure against its own limit, and nothing of the previous canary under the next one."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from kvpilot.demo import live

pytestmark = pytest.mark.unit

ACCURACY = {"name": "accuracyDelta", "canary": -3.131, "stable": -2.889, "threshold": 0.05, "ok": False}
TPOT = {"name": "tpotP95Ratio", "canary": 0.06, "stable": 0.04, "threshold": 1.5, "ok": True}
ERRORS = {"name": "errorRate", "canary": 0.0, "stable": 0.01, "threshold": 0.05, "ok": True}


def shown(renderable: Any) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def analysis(verdict: str, *checks: dict, at: str = "2026-12-03T06:00:00Z") -> dict:
    return {"verdict": verdict, "reason": verdict.title(), "at": at, "checks": list(checks)}


def test_each_check_is_shown_as_the_figure_its_limit_applies_to() -> None:
    line = shown(live.verdict_line(analysis("fail", ACCURACY, TPOT, ERRORS)))
    assert "accuracyDelta 0.242 (limit 0.05) BREACH" in line  # stable - canary, not the two scores
    assert "-3.131" not in line and "-2.889" not in line
    assert "tpotP95Ratio 1.5x (limit 1.5x) ok" in line
    assert "errorRate 0 vs 0.01 (limit 0.05) ok" in line
    missing = shown(live.verdict_line(analysis("inconclusive", {**ACCURACY, "canary": None, "ok": None})))
    assert "accuracyDelta - (limit 0.05) n/a" in missing


def isvc(spec_hash: str, phase: str, analyses: list[dict]) -> dict:
    return {"spec": {"canary": {"steps": [1, 5, 100]}},
            "status": {"canary": {"specHash": spec_hash, "phase": phase, "step": 2, "weight": 100,
                                  "analyses": analyses, "message": f"{phase} message"}}}  # fmt: skip


def test_the_next_canary_shows_nothing_of_the_previous_one() -> None:
    old = [analysis("pass", ERRORS, at="2026-12-03T05:01:02Z"), analysis("fail", ACCURACY, at="2026-12-03T05:03:04Z")]
    before = isvc("hash-1", "Succeeded", old)  # canary 2 applied; the operator has not started it yet
    view = shown(live.rollout_view("canary 2", before, None, {}, previous_spec="hash-1"))
    assert "05:01:02" not in view and "05:03:04" not in view and "accuracyDelta" not in view, view
    assert "Succeeded" not in view and "not started this canary yet" in view
    started = isvc("hash-2", "Progressing", [analysis("pass", TPOT, at="2026-12-03T06:10:00Z")])
    view = shown(live.rollout_view("canary 2", started, None, {}, previous_spec="hash-1"))
    assert "06:10:00" in view and "Progressing" in view and "tpotP95Ratio" in view

    feed = live.VerdictFeed("hash-1")
    assert feed.new(before["status"]["canary"]) == []  # printed lines too: none of canary 1's
    assert feed.new(started["status"]["canary"]) == started["status"]["canary"]["analyses"]
    assert feed.new(started["status"]["canary"]) == []  # each once, also when watched again
    later = isvc("hash-2", "Progressing", [*started["status"]["canary"]["analyses"], analysis("fail", ERRORS)])
    assert [a["verdict"] for a in feed.new(later["status"]["canary"])] == ["fail"]


def test_the_check_names_are_the_operators() -> None:
    from kvpilot.operator.analysis import probes
    from kvpilot.operator.analysis.judge import Figures, checks_for
    from kvpilot.operator.analysis.thresholds import Thresholds

    assert live.ACCURACY_CHECK == probes.ACCURACY_CHECK
    figures = Figures(ttft_p95=0.2, tpot_p95=0.02)
    ratios = {c.name for c in checks_for(figures, figures, Thresholds()) if c.message.endswith("x")}  # "= 1x <= 1.5x"
    assert set(live.RATIO_CHECKS) == ratios
