"""Pure rich renderables of a rollout as the demo shows it live: phase, step, weight, each
analysis verdict with its figures, the lineage of both tracks, and the load so far."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvpilot.figures import figure

VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "inconclusive": "yellow"}


def verdict_line(analysis: Mapping[str, Any]) -> Text:
    """One analysis as a line: verdict, reason, and every check's canary vs stable (threshold)."""
    verdict = str(analysis.get("verdict", "?"))
    text = Text(f"{verdict:>12}", style=VERDICT_STYLE.get(verdict, ""))
    text.append(f"  {analysis.get('reason', '')}  ")
    for c in analysis.get("checks") or []:
        mark = {True: "ok", False: "BREACH", None: "n/a"}[c.get("ok")]
        text.append(f"{c['name']} {figure(c.get('canary'))} vs {figure(c.get('stable'))} "
                    f"(limit {figure(c.get('threshold'))}) {mark}; ",
                    style="red" if c.get("ok") is False else "")
    return text


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
                 load: Mapping[str, Any], last_analyses: int = 4) -> Group:
    status = isvc.get("status") or {}
    canary = status.get("canary") or {}
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
