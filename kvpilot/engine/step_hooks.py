"""What the engine does around each step for long context and the mission metrics.

One object so the engine needs three hook calls: `before_run` (arm validation and head-utilisation
capture), `after_step` (validate, fall back, evict) and `feed_sections` (their stats). It holds THE list
of runtime checks, one per active approximation (eviction, 8-bit KV, Performer, MLA conversion).
With the defaults (no eviction, no approximation active) validation has no check to run and
eviction drops nothing, so the engine's outputs are exactly those without this object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.core.pools import PooledBlockManager
from kvpilot.engine.core.scheduler import Scheduler, SchedulerOutput
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.metrics.head_utilization import HeadUtilizationSampler
from kvpilot.engine.metrics.stats_contract import FALLBACK_REASONS
from kvpilot.engine.strategies.eviction.check import EvictionCheck, check_pool_fits, eviction_policy
from kvpilot.engine.strategies.eviction.policy import Evictor
from kvpilot.engine.strategies.fallback.reserve import reserve_feed
from kvpilot.engine.strategies.gqa.check import gqa_checks
from kvpilot.engine.strategies.kv_quant.check import kv_quant_checks
from kvpilot.engine.strategies.linear.check import linear_checks
from kvpilot.engine.strategies.mla.check import mla_checks
from kvpilot.engine.validation.runner import ApproximationCheck, ValidationRunner


class StepHooks:
    """Eviction, runtime validation and sampled head utilisation, driven by the engine's step.

    Takes what it uses: the config, the runner (model, KV layout), the block manager and scheduler
    (eviction bounds a prefill chunk) and `requeue(seq)`, which sends a sequence back to be recomputed.
    """

    def __init__(
        self,
        config: EngineConfig,
        runner: Any,
        block_manager: Any,
        scheduler: Scheduler,
        max_model_len: int,
        requeue: Callable[[Sequence], None],
    ) -> None:
        policy = eviction_policy(config)
        bm = block_manager
        manager_for = bm.manager_of if isinstance(bm, PooledBlockManager) else None  # the seq's own pool
        self.evictor = Evictor(policy, bm, manager_for) if policy.enabled else None
        if self.evictor is not None:
            chunk = policy.window_blocks * bm.block_size
            check_pool_fits(policy, bm, max_model_len, chunk)
            scheduler.max_chunk_tokens = chunk  # a long prompt is evicted between chunks
        evicting = self.evictor is not None
        checks: list[ApproximationCheck] = [EvictionCheck(runner, bm, requeue)] if evicting else []
        checks += kv_quant_checks(runner, bm, requeue)
        checks += linear_checks(runner, bm, requeue, evicting)
        checks += mla_checks(runner, bm, requeue)
        checks += gqa_checks(runner, config, bm, requeue)
        self.validation = ValidationRunner(config, runner, checks)
        self.block_manager = bm
        layers = runner.model.attention_layers()
        self.head_utilization = HeadUtilizationSampler(layers, config.head_utilization_every)

    def add_check(self, check: ApproximationCheck) -> None:
        """Let a strategy path register its approximation for runtime validation."""
        self.validation.checks.append(check)
        self.validation.fallbacks_total.setdefault(check.name, dict.fromkeys(FALLBACK_REASONS, 0))

    def before_run(self, out: SchedulerOutput) -> None:
        self.validation.before_run(out)
        self.head_utilization.before_run(out)

    def after_step(self, out: SchedulerOutput) -> None:
        self.head_utilization.after_step()
        self.validation.after_step()
        if self.evictor is not None:
            for item in out.scheduled:
                self.evictor.evict(item.seq)

    def feed_sections(self) -> dict[str, Any]:
        """Their sections of the stats feed: validation counters and gqa_head_utilization."""
        validation = self.validation.feed()
        validation["reserve"] = reserve_feed(self.block_manager)
        return {"validation": validation, "gqa_head_utilization": self.head_utilization.feed()}
