"""THE registry of memory strategies: one instance of each per engine, asked in one order.

The runner (load steps, cache specs, reserves), the KV cache, the CUDA graphs and the step hooks
loop over it; nothing else names a strategy. Order: eviction, kv_quant, linear, mla, gqa (runtime
checks register in this order; the load steps of linear, mla and gqa never apply together).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.core.cache_spec import KVCacheSpec
from kvpilot.engine.core.scheduler import Scheduler, SchedulerOutput
from kvpilot.engine.metrics.stats_contract import FeedSections
from kvpilot.engine.strategies.contract import (
    BlockManagerLike,
    ConversionReserve,
    MemoryStrategy,
    Requeue,
    RunnerView,
    WeightTransform,
)
from kvpilot.engine.strategies.eviction.strategy import EvictionStrategy
from kvpilot.engine.strategies.gqa.strategy import GqaStrategy
from kvpilot.engine.strategies.kv_quant.strategy import KVQuantStrategy
from kvpilot.engine.strategies.linear.strategy import LinearStrategy
from kvpilot.engine.strategies.mla.strategy import MlaStrategy
from kvpilot.engine.validation.runner import ApproximationCheck


class Strategies:
    """Every memory strategy of one engine, typed by name for the runner's reads, iterable for the loops."""

    def __init__(self, config: EngineConfig, checkpoint: ModelConfig) -> None:
        self.eviction = EvictionStrategy(config, checkpoint)
        self.kv_quant = KVQuantStrategy(config, checkpoint)
        self.linear = LinearStrategy(config, checkpoint)
        self.mla = MlaStrategy(config, checkpoint)
        self.gqa = GqaStrategy(config, checkpoint)
        self.all: tuple[MemoryStrategy, ...] = (self.eviction, self.kv_quant, self.linear, self.mla, self.gqa)

    def __iter__(self) -> Iterator[MemoryStrategy]:
        return iter(self.all)

    @property
    def enabled(self) -> list[str]:
        return [s.name for s in self.all if s.enabled]

    def weight_transform(self, served: ModelConfig) -> WeightTransform | None:
        """The strategies' load transforms composed in registry order (None: tensors load as they are)."""
        transforms = [t for s in self.all if (t := s.weight_transform(served)) is not None]
        if len(transforms) <= 1:
            return transforms[0] if transforms else None

        def composed(name: str, tensor: Any) -> Any:
            for transform in transforms:
                tensor = transform(name, tensor)
            return tensor

        return composed

    def load(self, runner: RunnerView, world: int) -> None:
        for strategy in self.all:
            strategy.load(runner, world)

    def cache_spec(self, spec: KVCacheSpec, runner: RunnerView) -> KVCacheSpec:
        for strategy in self.all:
            spec = strategy.cache_spec(spec, runner)
        return spec

    def conversion_reserve(self, runner: RunnerView) -> ConversionReserve | None:
        reserves = [r for s in self.all if (r := s.conversion_reserve(runner)) is not None]
        if len(reserves) > 1:  # config/strategy.py refuses the combinations that would ask for two
            raise ValueError(f"two conversions ask for a fallback reserve: {reserves}")
        return reserves[0] if reserves else None

    def shares_blocks(self, runner: RunnerView) -> bool:
        return any(s.shares_blocks(runner) for s in self.all)

    def graph_blocker(self, runner: RunnerView) -> str | None:
        return next((r for s in self.all if (r := s.graph_blocker(runner)) is not None), None)

    def attach(self, block_manager: BlockManagerLike, scheduler: Scheduler, max_model_len: int) -> None:
        for strategy in self.all:
            strategy.attach(block_manager, scheduler, max_model_len)

    def after_step(self, out: SchedulerOutput) -> None:
        for strategy in self.all:
            strategy.after_step(out)

    def checks(self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Requeue) -> list[ApproximationCheck]:
        return [check for s in self.all for check in s.checks(runner, block_manager, requeue)]

    def feed(self, runner: RunnerView) -> FeedSections:
        sections: FeedSections = {}
        for strategy in self.all:
            sections.update(strategy.feed(runner))
        return sections
