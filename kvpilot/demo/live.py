"""Pure rich renderables of a rollout as the demo shows it live: phase, step, weight, each
analysis verdict with its figures, the lineage of both tracks, and the load so far.

A canary is told apart by its spec hash: until the operator has started the one just applied,
`.status.canary` still describes the one before, and none of that is shown under the new one."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvpilot.figures import figure

VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "yellow"}
ACCURACY_CHECK = "accuracyDelta"  # = kvpilot.operator.analysis.probes.ACCURACY_CHECK: limit on stable - canary
RATIO_CHECKS = ("ttftP95Ratio", "tpotP95Ratio")  # limit on canary / stable (operator.analysis.judge)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def check_figures(check: Mapping[str, Any]) -> str:
    """The figure a check's limit applies to, against that limit: the accuracy delta itself, a
    latency ratio as a ratio; other checks compare the canary's figure (stable's for context)."""
    name, canary, stable = check["name"], _number(check.get("canary")), _number(check.get("stable"))
    limit = figure(check.get("threshold"))
    if name == ACCURACY_CHECK:
        delta = stable - canary if canary is not None and stable is not None else None
        return f"{name} {figure(delta)} (limit {limit})"
    if name in RATIO_CHECKS:
        ratio = None
        if canary is not None and stable is not None:
            ratio = canary / stable if stable > 0 else (1.0 if canary <= 0 else float("inf"))
        return f"{name} {figure(ratio)}x (limit {limit}x)"
    return f"{name} {figure(check.get('canary'))} vs {figure(check.get('stable'))} (limit {limit})"


def verdict_line(analysis: Mapping[str, Any]) -> Text:
    """One analysis as a line: verdict, reason, and every check's figure against its limit."""
    verdict = str(analysis.get("verdict", "?"))
    text = Text(f"{verdict:>12}", style=VERDICT_STYLE.get(verdict, ""))
    text.append(f"  {analysis.get('reason', '')}  ")
    for c in analysis.get("checks") or []:
        mark = {True: "ok", False: "BREACH", None: "n/a"}[c.get("ok")]
        text.append(f"{check_figures(c)} {mark}; ", style="red" if c.get("ok") is False else "")
    return text


def is_previous(canary: Mapping[str, Any], previous_spec: str | None) -> bool:
    """True while `.status.canary` still describes the canary before the one being watched."""
    return previous_spec is not None and canary.get("specHash") == previous_spec


class VerdictFeed:
    """The analyses of one canary not yet printed: none of the canary before it (same status until
    the operator starts the new one), each of its own once, across several watches of it."""

    def __init__(self, previous_spec: str | None) -> None:
        self.previous_spec = previous_spec
        self._spec: str | None = None
        self._seen = 0

    def new(self, canary: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        if is_previous(canary, self.previous_spec):
            return []
        if canary.get("specHash") != self._spec:
            self._spec, self._seen = canary.get("specHash"), 0
        analyses = canary.get("analyses") or []
        fresh, self._seen = analyses[self._seen :], len(analyses)
        return list(fresh)


def lineage_rows(configmap: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """(track, current, previous) with strategy and the model digest's first 12 hex digits."""
    data = (configmap or {}).get("data") or {}

    def describe(entry: Mapping[str, Any] | None) -> str:
        if not entry:
            return "-"
        sha = str(entry.get("sha256") or "")[:12] or "no digest"
        return f"{entry.get('strategy', '?')} @ {entry.get('path', '?')} ({sha})"

    rows = []
    for track in ("stable", "canary"):
        if data.get(track):
            lineage = json.loads(data[track])
            rows.append((track, describe(lineage.get("current")), describe(lineage.get("previous"))))
    return rows


def rollout_view(stage: str, isvc: Mapping[str, Any], lineage: Mapping[str, Any] | None,
                 load: Mapping[str, Any], last_analyses: int = 4, previous_spec: str | None = None) -> Group:
    """`previous_spec`: the spec hash of the canary before this stage's (its status is not shown)."""
    status = isvc.get("status") or {}
    canary = status.get("canary") or {}
    waiting = is_previous(canary, previous_spec)
    if waiting:
        canary = {"phase": "Pending", "message": "the operator has not started this canary yet"}
    steps: Sequence[int] = ((isvc.get("spec") or {}).get("canary") or {}).get("steps") or []
    head = Table.grid(padding=(0, 2))
    head.add_row(Text(stage, style="bold cyan"))
    state = Table(title="rollout", show_header=False, box=None, padding=(0, 1))
    step = canary.get("step")
    state.add_row("phase", Text(str(canary.get("phase", "Idle")), style="bold"))
    state.add_row("step", f"{step} of {list(steps)}" if step is not None and steps else "-")
    state.add_row("canary weight", f"{canary.get('weight', 0)} %")
    state.add_row("failures", str(canary.get("failures", 0)))
    if canary.get("message"):
        state.add_row("message", str(canary["message"])[:160])
    verdicts = Table(title="analyses (newest last)", show_header=False, box=None)
    for analysis in (canary.get("analyses") or [])[-last_analyses:]:
        verdicts.add_row(Text(str(analysis.get("at", ""))[11:19]), verdict_line(analysis))
    lin = Table(title="lineage", box=None)
    lin.add_column("track")
    lin.add_column("current")
    lin.add_column("previous (what a rollback restores)")
    for row in lineage_rows(lineage):
        lin.add_row(*row)
    traffic = Table(title="load through the gateway", show_header=False, box=None)
    traffic.add_row("requests", f"{load.get('requests', 0)} sent, {load.get('failed', 0)} failed")
    served = load.get("by_strategy") or {}
    traffic.add_row("served by", ", ".join(f"{k or '?'}: {v}" for k, v in sorted(served.items())) or "-")
    return Group(head, state, verdicts, lin, traffic)
