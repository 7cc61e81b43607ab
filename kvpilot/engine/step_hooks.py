"""What the engine does around each step for long context and the mission metrics.

One object so the engine needs three hook calls: `before_run` (arm validation and head-utilisation
capture), `after_step` (validate, fall back, then each strategy's `after_step`: eviction) and
`feed_sections` (their stats). THE list of runtime checks comes from the strategy registry
(strategies/registry.py), one per active approximation (eviction, 8-bit KV, Performer, MLA, GQA).
With the defaults (no eviction, no approximation active) validation has no check to run and
eviction drops nothing, so the engine's outputs are exactly those without this object.
"""

from __future__ import annotations

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.core.reserve import reserve_feed
from kvpilot.engine.core.scheduler import Scheduler, SchedulerOutput
from kvpilot.engine.metrics.head_utilization import HeadUtilizationSampler
from kvpilot.engine.metrics.stats_contract import (
    FALLBACK_REASONS,
    FeedSections,
    ValidationSection,
)
from kvpilot.engine.strategies.contract import BlockManagerLike, Requeue
from kvpilot.engine.validation.runner import ApproximationCheck, ValidationRunner
from kvpilot.engine.worker.model_runner import ModelRunner


class StepHooks:
    """Eviction, runtime validation and sampled head utilisation, driven by the engine's step.

    Takes what it uses: the config, the runner (model, KV layout), the block manager and scheduler
    (eviction bounds a prefill chunk) and `requeue(seq)`, which sends a sequence back to be recomputed.
    """

    def __init__(
        self,
        config: EngineConfig,
        runner: ModelRunner,
        block_manager: BlockManagerLike,
        scheduler: Scheduler,
        max_model_len: int,
        requeue: Requeue,
    ) -> None:
        self.strategies = runner.strategies  # the registry: each strategy's runtime part, in its order
        self.strategies.attach(block_manager, scheduler, max_model_len)  # eviction bounds prefill chunks
        self.evictor = self.strategies.eviction.evictor  # None without eviction
        checks = self.strategies.checks(runner, block_manager, requeue)  # THE list of runtime checks
        self.validation = ValidationRunner(config, runner, checks)
        self.block_manager = block_manager
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
        self.strategies.after_step(out)  # eviction drops what fell out of its window

    def feed_sections(self) -> FeedSections:
        """Their sections of the stats feed: validation counters and gqa_head_utilization."""
        validation = ValidationSection(**self.validation.feed(), reserve=reserve_feed(self.block_manager))
        return {"validation": validation, "gqa_head_utilization": self.head_utilization.feed()}
