"""GQA's contract: KV heads merged as the checkpoint loads, regrouped after, an unmerged reserve, its check."""

from __future__ import annotations

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.config.strategy import gqa_groups
from kvpilot.engine.strategies.contract import (
    BlockManagerLike,
    ConversionReserve,
    MemoryStrategy,
    Requeue,
    RunnerView,
    WeightTransform,
)
from kvpilot.engine.strategies.gqa.apply import apply_gqa
from kvpilot.engine.strategies.gqa.check import gqa_checks
from kvpilot.engine.strategies.gqa.convert import gqa_transform
from kvpilot.engine.strategies.gqa.reserve import gqa_reserve_applies
from kvpilot.engine.validation.runner import ApproximationCheck


class GqaStrategy(MemoryStrategy):
    name = "gqa"
    transform: WeightTransform | None = None
    orders: list[list[int]] | None = None  # per layer, when heads were grouped on calibration text

    @property
    def enabled(self) -> bool:
        return gqa_groups(self.config) is not None

    def weight_transform(self, served: ModelConfig) -> WeightTransform | None:
        self.transform = gqa_transform(self.config, served)
        return self.transform

    def load(self, runner: RunnerView, world: int) -> None:
        # calibrated grouping and compensation; the original K/V kept for the reserve
        self.orders = apply_gqa(runner.model, self.config, self.transform, runner.device, world)

    def _reserve_applies(self, world: int) -> bool:
        return gqa_reserve_applies(self.config, self.checkpoint.num_key_value_heads, world)

    def conversion_reserve(self, runner: RunnerView) -> ConversionReserve | None:
        if self._reserve_applies(runner.world):
            return ConversionReserve(self.config.fallback_reserve, self.checkpoint.num_key_value_heads)
        return None

    def graph_blocker(self, runner: RunnerView) -> str | None:
        if self._reserve_applies(runner.world) and len(runner.kv_pool_sizes) == 2:
            return "the GQA conversion's fallback reserve pool: a step's layers take per-pool paths chosen on the host"
        return None

    def checks(
        self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Requeue
    ) -> list[ApproximationCheck]:
        return list(gqa_checks(runner, self.config, block_manager, requeue))
