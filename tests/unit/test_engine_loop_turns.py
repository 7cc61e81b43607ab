"""The engine loop's turns: scores wait for their turn between steps, and an out-of-memory step
preempts and retries. A plain-Python engine stands in so the order of calls is observable."""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.scheduler import Scheduler
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.server.runtime.engine_loop import EngineLoop
from kvpilot.engine.server.runtime.oom import MAX_OOM_RETRIES

pytestmark = pytest.mark.unit


class TurnEngine:
    """Has work for `steps` steps; records every step and call in `events`."""

    def __init__(self, steps: int) -> None:
        self.remaining = steps
        self.events: list[str] = []
        self.gate = threading.Event()

    def has_unfinished_requests(self) -> bool:
        return self.remaining > 0

    def step(self) -> list[Any]:
        self.gate.wait(10)  # the test queues its calls before the first step runs
        self.remaining -= 1
        self.events.append("step")
        return []


def test_queued_scores_run_one_per_step_so_streams_keep_going() -> None:
    # Finding 2: 24 queued scores ran back to back and a running stream stalled behind them.
    engine = TurnEngine(steps=3)
    loop = EngineLoop(engine).start()
    try:
        scores = [loop.call(lambda e, i=i: e.events.append(f"score{i}"), heavy=True) for i in range(3)]
        stats = loop.call(lambda e: e.events.append("stats"))
        engine.gate.set()
        concurrent.futures.wait([*scores, stats], timeout=10)
    finally:
        loop.stop()
    heavy = [i for i, event in enumerate(engine.events) if event.startswith("score")]
    assert len(heavy) == 3
    for a, b in itertools.pairwise(heavy):
        assert "step" in engine.events[a:b], engine.events  # a step between any two scores
    assert engine.events.index("stats") < heavy[-1]  # light calls do not queue behind scores


class OomEngine:
    """Runs out of memory while more than `fits` sequences run: the core scheduler and block manager
    are real, and the shedding methods are LLMEngine's own."""

    shed_load = LLMEngine.shed_load
    batch_limit = LLMEngine.batch_limit
    restore_batch_limit = LLMEngine.restore_batch_limit

    def __init__(self, running: int, fits: int) -> None:
        self.scheduler = Scheduler(BlockManager(num_blocks=64, block_size=4), max_num_seqs=8)
        for i in range(running):
            seq = Sequence(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=4))
            seq.arrival_time = float(i)
            self.scheduler.add(seq)
        self.scheduler.schedule()  # all admitted: running, blocks held
        self.runner = SimpleNamespace(release_state=lambda request_id: None)
        self._configured_max_seqs: int | None = None
        self.fits = fits
        self.steps_ok = 0

    def has_unfinished_requests(self) -> bool:
        return self.steps_ok < 2

    def step(self) -> list[Any]:
        if len(self.scheduler.running) > self.fits:
            raise MemoryError("simulated: CUDA out of memory. Tried to allocate 2.00 GiB")
        self.steps_ok += 1
        return []


def _run(engine: Any) -> EngineLoop:
    loop = EngineLoop(engine).start()
    done = threading.Event()

    def wait() -> None:
        while engine.has_unfinished_requests() and loop.alive:
            threading.Event().wait(0.01)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    done.wait(10)
    loop.stop()
    return loop


def test_out_of_memory_preempts_the_newest_and_retries() -> None:
    engine = OomEngine(running=4, fits=2)
    loop = _run(engine)
    assert engine.steps_ok == 2 and loop.step_failures == 0
    assert [s.request_id for s in engine.scheduler.waiting] == ["r2", "r3"]  # newest first out
    assert engine.scheduler.max_num_seqs == 2  # the batch stays small for a while
    assert loop.oom.recoveries == 2


def test_out_of_memory_with_nothing_to_preempt_fails_after_the_retries() -> None:
    engine = OomEngine(running=1, fits=0)
    loop = EngineLoop(engine)
    engine.has_unfinished_requests = lambda: loop.step_failures == 0  # type: ignore[method-assign]
    loop.start()
    try:
        for _ in range(500):
            if loop.step_failures:
                break
            threading.Event().wait(0.01)
    finally:
        loop.stop()
    assert loop.step_failures == 1 and loop.oom.recoveries == MAX_OOM_RETRIES
    assert engine.scheduler.running and not engine.scheduler.waiting  # nothing was preempted
