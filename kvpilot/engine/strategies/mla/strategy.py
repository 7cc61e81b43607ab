"""MLA's contract: native DeepSeek MLA or the SVD conversion at load, latent pages, its graphs, check and feed."""

from __future__ import annotations

from kvpilot.engine.config.strategy import conversion_rank
from kvpilot.engine.core.cache_spec import KVCacheSpec, LatentSpec
from kvpilot.engine.metrics.stats_contract import FeedSections
from kvpilot.engine.strategies.contract import (
    BlockManagerLike,
    ConversionReserve,
    MemoryStrategy,
    Requeue,
    RunnerView,
)
from kvpilot.engine.strategies.mla.apply import MlaState, apply_mla
from kvpilot.engine.strategies.mla.check import mla_checks
from kvpilot.engine.validation.runner import ApproximationCheck


def kernel_decoded_conversion(runner: RunnerView) -> bool:
    """The MLA conversion whose decode is a Triton kernel over the latent rows with no per-step plan on
    the host, so it can be captured: partial RoPE (mla_decode, absorbed, strategies/mla/partial.py), or
    RoPE on every dim where the fused kernel fits the head (mla_conversion, strategies/mla/attention.py)."""
    mla = runner.mla
    if mla.mode != "converted":
        return False
    if mla.absorbed_decode:
        return True
    from kvpilot.engine.strategies.mla.attention import fused_decode_fits

    return fused_decode_fits(runner.model_config.head_dim, runner.dtype, runner.kv_layout.dtype)


def kernel_decoded_latent(runner: RunnerView) -> bool:
    """Decode over a latent cache by kernels alone: native DeepSeek MLA absorbed (mla_decode), or an MLA
    conversion decoded by a kernel (`kernel_decoded_conversion`)."""
    if runner.mla.mode == "native":
        return bool(runner.mla.absorbed_decode)
    return kernel_decoded_conversion(runner)


class MlaStrategy(MemoryStrategy):
    name = "mla"
    state = MlaState("off", None, False)  # what load() set up

    @property
    def enabled(self) -> bool:
        return self.checkpoint.deepseek is not None or conversion_rank(self.config, self.checkpoint) is not None

    def load(self, runner: RunnerView, world: int) -> None:
        self.state = apply_mla(runner.model, self.config, runner.model_config)  # converts in place

    def cache_spec(self, spec: KVCacheSpec, runner: RunnerView) -> KVCacheSpec:
        if self.state.latent_width is None:
            return spec
        return LatentSpec(self.state.latent_width, runner.kv_layout.dtype.itemsize)

    def conversion_reserve(self, runner: RunnerView) -> ConversionReserve | None:
        if self.state.mode == "converted" and self.config.fallback_reserve > 0:
            return ConversionReserve(self.config.fallback_reserve)
        return None

    def graph_blocker(self, runner: RunnerView) -> str | None:
        if self.state.latent_width is not None and not kernel_decoded_latent(runner):
            return "MLA latent cache: per-step decode plans on the host"
        return None

    def checks(
        self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Requeue
    ) -> list[ApproximationCheck]:
        return list(mla_checks(runner, block_manager, requeue))

    def feed(self, runner: RunnerView) -> FeedSections:
        return {"mla": self.state.stats()}  # mode, latent width, SVD reconstruction error
