"""Eviction's contract: sinks + window (or ladder) views over one pool, evicted after each step."""

from __future__ import annotations

from kvpilot.engine.core.pools import PooledBlockManager
from kvpilot.engine.core.scheduler import Scheduler, SchedulerOutput
from kvpilot.engine.strategies.contract import BlockManagerLike, MemoryStrategy, Requeue, RunnerView
from kvpilot.engine.strategies.eviction.check import EvictionCheck, check_pool_fits, eviction_policy
from kvpilot.engine.strategies.eviction.policy import Evictor
from kvpilot.engine.validation.runner import ApproximationCheck


class EvictionStrategy(MemoryStrategy):
    name = "eviction"
    evictor: Evictor | None = None  # set by attach() when eviction is on

    @property
    def enabled(self) -> bool:
        return self.config.eviction != "none"

    def shares_blocks(self, runner: RunnerView) -> bool:
        return self.enabled  # its exact path is the full context over the same blocks

    def graph_blocker(self, runner: RunnerView) -> str | None:
        if self.enabled:
            return f"eviction {self.config.eviction!r}: resident views change the step's layout"
        return None

    def attach(self, block_manager: BlockManagerLike, scheduler: Scheduler, max_model_len: int) -> None:
        policy = eviction_policy(self.config)
        if not policy.enabled:
            return
        bm = block_manager
        manager_for = bm.manager_of if isinstance(bm, PooledBlockManager) else None  # the seq's own pool
        self.evictor = Evictor(policy, bm, manager_for)
        chunk = policy.window_blocks * bm.block_size
        check_pool_fits(policy, bm, max_model_len, chunk)
        scheduler.max_chunk_tokens = chunk  # a long prompt is evicted between chunks

    def after_step(self, out: SchedulerOutput) -> None:
        if self.evictor is not None:
            for item in out.scheduled:
                self.evictor.evict(item.seq)

    def checks(
        self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Requeue
    ) -> list[ApproximationCheck]:
        return [EvictionCheck(runner, block_manager, requeue)] if self.enabled else []
