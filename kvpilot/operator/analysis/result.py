"""`Check` and `AnalysisResult`: one analysis, as judged and as stored in `.status.canary.analyses[]`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Verdict = Literal["pass", "fail", "inconclusive"]
VERDICTS = ("pass", "fail", "inconclusive")


@dataclass(frozen=True)
class Check:
    """One comparison: the canary's figure, stable's for context, the limit, and whether it held.

    ok is None when the figure could not be computed (no data): never a pass.
    """

    name: str
    canary: float | None
    stable: float | None
    threshold: float | None
    ok: bool | None
    message: str


@dataclass(frozen=True)
class AnalysisResult:
    """A verdict with the checks behind it; `reason` is CamelCase for conditions and events."""

    verdict: Verdict
    checks: tuple[Check, ...]
    reason: str
    message: str
    window_s: float
    at: str  # RFC 3339, UTC

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_status(self) -> dict[str, Any]:
        """JSON-safe: non-finite figures become null (the message keeps the text)."""
        return {
            "verdict": self.verdict, "reason": self.reason, "message": self.message,
            "windowSeconds": _number(self.window_s), "at": self.at,
            "checks": [{"name": c.name, "canary": _number(c.canary), "stable": _number(c.stable),
                        "threshold": _number(c.threshold), "ok": c.ok, "message": c.message}
                       for c in self.checks],
        }

    @classmethod
    def from_status(cls, d: Mapping[str, Any]) -> AnalysisResult:
        checks = tuple(Check(c["name"], c.get("canary"), c.get("stable"), c.get("threshold"), c.get("ok"),
                             c.get("message", "")) for c in d.get("checks", []))
        return cls(d["verdict"], checks, d.get("reason", ""), d.get("message", ""),
                   float(d.get("windowSeconds", 0)), d.get("at", ""))


def _number(value: float | None) -> float | int | None:
    if value is None or not math.isfinite(value):
        return None
    if float(value).is_integer() and abs(value) < 2**53:
        return int(value)
    return float(f"{value:.6g}")
