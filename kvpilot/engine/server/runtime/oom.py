"""Out-of-memory in an engine step: free memory by preempting the newest sequence, run a smaller
batch for a while, and retry the step instead of failing requests or crashing.

The engine counts the event itself (`requests.oom_events_total`); this module decides what to
give up. Torch is looked up, never imported: the engine loop stays importable without it.
"""

from __future__ import annotations

import logging
import sys
from typing import Protocol

log = logging.getLogger("kvpilot.server")

MAX_OOM_RETRIES = 3  # out-of-memory steps in a row before the step's requests are failed
RESTORE_AFTER_STEPS = 200  # good steps at the reduced batch size before the configured one returns


def is_out_of_memory(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return (oom_type is not None and isinstance(exc, oom_type)) or isinstance(exc, MemoryError)


class LoadShedding(Protocol):
    """What recovery needs of the engine (LLMEngine's public shedding methods)."""

    @property
    def batch_limit(self) -> int: ...

    def shed_load(self) -> str | None: ...

    def restore_batch_limit(self) -> bool: ...


class OomRecovery:
    """Preempt-and-retry for one engine; call on_oom() when a step ran out of memory and
    on_good_step() after each step that succeeded."""

    def __init__(self, engine: LoadShedding) -> None:
        self.engine = engine
        self.in_a_row = 0
        self.recoveries = 0
        self._lowered = False  # shed_load() capped the engine's batch; restored after good steps
        self._good_steps = 0

    def on_oom(self, exc: BaseException) -> bool:
        """True: memory was freed and the step may be retried. False: give up (fail the step)."""
        self.in_a_row += 1
        release_cached_memory()
        if self.in_a_row > MAX_OOM_RETRIES:
            log.error("engine.step() ran out of memory %d times in a row; failing its requests: %s",
                      self.in_a_row, exc)
            self.in_a_row = 0
            return False
        victim = self._preempt_newest()
        self.recoveries += 1
        log.warning("engine.step() ran out of memory (%s); %s, batch limit now %s; retrying", exc,
                    f"preempted {victim}" if victim else "nothing to preempt", self.engine.batch_limit)
        return True

    def on_good_step(self) -> None:
        self.in_a_row = 0
        if not self._lowered:
            return
        self._good_steps += 1
        if self._good_steps >= RESTORE_AFTER_STEPS and self.engine.restore_batch_limit():
            log.info("batch limit back to %d after %d steps without running out of memory",
                     self.engine.batch_limit, self._good_steps)
            self._lowered = False

    def _preempt_newest(self) -> str | None:
        victim = self.engine.shed_load()
        if victim is not None:
            self._lowered = True
            self._good_steps = 0
        return victim


def release_cached_memory() -> None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and cuda.is_available():
        cuda.empty_cache()
