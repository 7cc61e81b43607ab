"""The phases of a canary rollout (status.canary.phase)."""

from __future__ import annotations

IDLE = "Idle"
PROGRESSING = "Progressing"
ANALYSING = "Analysing"
PAUSED = "Paused"
PROMOTING = "Promoting"
PROMOTED = "Promoted"
ROLLING_BACK = "RollingBack"
ROLLED_BACK = "RolledBack"
FAILED = "Failed"

ALL = (IDLE, PROGRESSING, ANALYSING, PAUSED, PROMOTING, PROMOTED, ROLLING_BACK, ROLLED_BACK, FAILED)
# A canary track exists and may carry traffic: the rollback flag acts on these.
ACTIVE = frozenset({PROGRESSING, ANALYSING, PAUSED, PROMOTING, ROLLING_BACK})
# Finished for this canary spec: only a new spec.canary (or, after a promotion, the flag) moves on.
DONE = frozenset({PROMOTED, ROLLED_BACK, FAILED})
