"""KV quantisation's contract: 8-bit K/V pages (int8 / fp8), or 16-bit + int8 pools under auto switching."""

from __future__ import annotations

from kvpilot.engine.config.strategy import QUANTISED, kv_cache_kind
from kvpilot.engine.core.cache_spec import INT8_SCALE_BYTES, FullAttentionSpec, KVCacheSpec, QuantizedKVSpec
from kvpilot.engine.strategies.contract import BlockManagerLike, MemoryStrategy, Requeue, RunnerView
from kvpilot.engine.strategies.kv_quant.check import kv_quant_checks
from kvpilot.engine.validation.runner import ApproximationCheck
from kvpilot.strategy_schema import kv_dtype


class KVQuantStrategy(MemoryStrategy):
    name = "kv_quant"

    @property
    def enabled(self) -> bool:
        kind = kv_cache_kind(self.config)
        return kind in QUANTISED or kind == "auto-switch"

    def cache_spec(self, spec: KVCacheSpec, runner: RunnerView) -> KVCacheSpec:
        layout = runner.kv_layout
        if not layout.is_quantised or not isinstance(spec, FullAttentionSpec):
            return spec
        assert layout.quant is not None
        scale = INT8_SCALE_BYTES if kv_dtype(layout.quant).token_scales else 0
        # auto switching splits the memory between a 16-bit and an int8 pool: the 16-bit page sizes it
        return QuantizedKVSpec(spec, layout.quant, scale, sized_by_full=layout.kind == "auto-switch")

    def graph_blocker(self, runner: RunnerView) -> str | None:
        if runner.kv_layout.kind == "auto-switch":
            return "kv cache 'auto-switch': the step is split by pool on the host"
        return None  # int8/fp8 (with a reserve too): graphs run over the 8-bit pool (layers/pool_split.py)

    def checks(
        self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Requeue
    ) -> list[ApproximationCheck]:
        return list(kv_quant_checks(runner, block_manager, requeue))
