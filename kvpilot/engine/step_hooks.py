"""What the engine does around each step for long context and the mission metrics.

One object so the engine needs three hook calls: `before_run` (arm validation and head-utilisation
capture), `after_step` (validate, fall back, evict) and `fill_feed` (their stats). With the
defaults (no eviction, no approximation active) validation has no check to run and eviction
drops nothing, so the engine's outputs are exactly those without this object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvpilot.engine.eviction import EvictionPolicy, Evictor
from kvpilot.engine.head_utilization import HeadUtilizationSampler
from kvpilot.engine.kv_quant_check import kv_quant_checks
from kvpilot.engine.scheduler import SchedulerOutput
from kvpilot.engine.validation_runner import ApproximationCheck, EvictionCheck, ValidationRunner

if TYPE_CHECKING:
    from kvpilot.engine.llm_engine import LLMEngine


def eviction_policy(engine: LLMEngine) -> EvictionPolicy:
    c = engine.config
    return EvictionPolicy.from_tokens(
        c.eviction, c.eviction_sinks, c.eviction_window, c.eviction_ladder_span, c.block_size
    )


def check_pool_fits(policy: EvictionPolicy, engine: LLMEngine, chunk_tokens: int) -> None:
    """Raise if one sequence's resident view plus one prefill chunk could not fit the KV pool."""
    bm = engine.block_manager
    need = policy.max_resident_blocks(engine.max_model_len, bm.block_size) + bm.blocks_for(chunk_tokens) + 1
    if need > bm.num_blocks:
        raise ValueError(
            f"eviction {policy.mode!r} keeps up to {need} blocks per sequence (sinks {policy.sink_blocks}, "
            f"window {policy.window_blocks}, chunk {bm.blocks_for(chunk_tokens)} blocks) but the KV pool has "
            f"{bm.num_blocks}; shrink eviction_window / eviction_sinks or give the KV cache more memory"
        )


class RuntimeChecks:
    """Eviction, runtime validation and sampled head utilisation, driven by the engine's step."""

    def __init__(self, engine: LLMEngine, extra_checks: list[ApproximationCheck] | None = None) -> None:
        self.engine = engine
        policy = eviction_policy(engine)
        bm = engine.block_manager
        manager_for = getattr(bm, "_pool", None)  # PooledBlockManager (kv_pools.py): the seq's own pool
        self.evictor = Evictor(policy, bm, manager_for) if policy.enabled else None
        if self.evictor is not None:
            chunk = policy.window_blocks * engine.block_manager.block_size
            check_pool_fits(policy, engine, chunk)
            engine.scheduler.max_chunk_tokens = chunk  # a long prompt is evicted between chunks
        checks: list[ApproximationCheck] = [EvictionCheck(engine)] if self.evictor is not None else []
        checks += kv_quant_checks(engine)
        checks += extra_checks or []
        self.validation = ValidationRunner(engine, checks)
        layers = engine.runner.model.attention_layers()
        self.head_utilization = HeadUtilizationSampler(layers, engine.config.head_utilization_every)

    def add_check(self, check: ApproximationCheck) -> None:
        """Let a strategy path register its approximation for runtime validation."""
        self.validation.checks.append(check)

    def before_run(self, out: SchedulerOutput) -> None:
        self.validation.before_run(out)
        self.head_utilization.before_run(out)

    def after_step(self, out: SchedulerOutput) -> None:
        self.head_utilization.after_step()
        self.validation.after_step()
        if self.evictor is not None:
            for item in out.scheduled:
                self.evictor.evict(item.seq)

    def fill_feed(self, feed: dict[str, Any]) -> dict[str, Any]:
        feed["validation"] = self.validation.feed()
        feed["gqa_head_utilization"] = self.head_utilization.feed()
        return feed
