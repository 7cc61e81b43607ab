"""Out-of-memory in an engine step: free memory by preempting the newest sequence, run a smaller
batch for a while, and retry the step instead of failing requests or crashing.

The engine counts the event itself (`requests.oom_events_total`); this module decides what to
give up. Torch is looked up, never imported: the engine loop stays importable without it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger("kvpilot.server")

MAX_OOM_RETRIES = 3  # out-of-memory steps in a row before the step's requests are failed
RESTORE_AFTER_STEPS = 200  # good steps at the reduced batch size before the configured one returns


def is_out_of_memory(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return (oom_type is not None and isinstance(exc, oom_type)) or isinstance(exc, MemoryError)


class OomRecovery:
    """Preempt-and-retry for one engine; call on_oom() when a step ran out of memory and
    on_good_step() after each step that succeeded."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.in_a_row = 0
        self.recoveries = 0
        self._configured_max_seqs: int | None = None
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
                    f"preempted {victim}" if victim else "nothing to preempt", self._scheduler_max_seqs())
        return True

    def on_good_step(self) -> None:
        self.in_a_row = 0
        if self._configured_max_seqs is None:
            return
        self._good_steps += 1
        if self._good_steps >= RESTORE_AFTER_STEPS:
            self.engine.scheduler.max_num_seqs = self._configured_max_seqs
            log.info("batch limit back to %d after %d steps without running out of memory",
                     self._configured_max_seqs, self._good_steps)
            self._configured_max_seqs = None

    def _scheduler_max_seqs(self) -> Any:
        return getattr(getattr(self.engine, "scheduler", None), "max_num_seqs", None)

    def _preempt_newest(self) -> str | None:
        """Preempt the most recently admitted running sequence (its blocks freed, recomputed later)
        while another keeps running, and cap the batch at what is left."""
        scheduler = getattr(self.engine, "scheduler", None)
        running = list(getattr(scheduler, "running", ()))
        if scheduler is None or len(running) < 2:
            return None
        victim = max(running, key=lambda seq: seq.arrival_time)
        scheduler.running.remove(victim)
        scheduler._preempt(victim)  # frees its blocks, puts it first in the waiting queue
        runner = getattr(self.engine, "runner", None)
        if runner is not None and hasattr(runner, "release_state"):
            runner.release_state(victim.request_id)  # a recurrent summary is recomputed with it
        if self._configured_max_seqs is None:
            self._configured_max_seqs = scheduler.max_num_seqs
        scheduler.max_num_seqs = max(1, len(scheduler.running))
        self._good_steps = 0
        return str(victim.request_id)


def release_cached_memory() -> None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and cuda.is_available():
        cuda.empty_cache()
