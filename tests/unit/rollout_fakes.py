"""A minimal analysis result for the state machine's tests (the real one is the analysis package's)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class Result:
    verdict: str
    reason: str = "Checked"
    message: str = "figures"

    def to_status(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "message": self.message,
                "checks": [{"name": "ttft_p95_ratio", "canary": 1.0, "stable": 1.0, "threshold": 1.5, "ok": True}]}


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)
