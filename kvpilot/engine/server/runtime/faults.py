"""Test-only fault injection for `kvpilot serve` (--fault-latency-ms, --fault-error-rate).

Rollout tests need a canary that is measurably slower or failing. Both faults are off by
default and are never meant for production traffic.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from kvpilot.engine.server.http.errors import APIError


@dataclass(frozen=True)
class FaultSettings:
    """What to inject: latency before every engine step, and a share of generations failed."""

    latency_ms: float = 0.0
    error_rate: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.latency_ms >= 0:
            raise ValueError(f"--fault-latency-ms must be >= 0 milliseconds, got {self.latency_ms}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"--fault-error-rate must be a share between 0 and 1, got {self.error_rate}")

    @property
    def active(self) -> bool:
        return self.latency_ms > 0 or self.error_rate > 0


class FaultInjector:
    """Applies FaultSettings: `before_step` runs on the engine thread, `maybe_fail` on the API side."""

    def __init__(self, settings: FaultSettings) -> None:
        self.settings = settings
        self._rng = random.Random(settings.seed)

    def before_step(self) -> None:
        # Every step yields one token per running sequence (the first one for a prefill), so a
        # sleep here adds about latency_ms to TTFT and to every inter-token gap (TPOT).
        if self.settings.latency_ms > 0:
            time.sleep(self.settings.latency_ms / 1000.0)

    def maybe_fail(self) -> None:
        """Raise the injected 500 for this share of generation requests."""
        rate = self.settings.error_rate
        if rate > 0 and self._rng.random() < rate:
            raise APIError(
                500,
                f"injected fault: this server runs with --fault-error-rate {rate} (test only); retry",
                code="injected_fault",
            )
