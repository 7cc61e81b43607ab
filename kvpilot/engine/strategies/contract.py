"""The one contract every memory strategy declares, and the runner view it works on.

A strategy (GQA, MLA, linear attention, KV quantisation, eviction) says, in one class
(`MemoryStrategy`, one per package: `<strategy>/strategy.py`):
- its load step: a transform of checkpoint tensors as they load (`weight_transform`) and what it does
  to the model once they have (`load`);
- its per-layer KV cache spec (`cache_spec`, core/cache_spec.py) and a conversion's fallback reserve
  of unconverted K/V blocks (`conversion_reserve`);
- whether its exact path reuses the approximate pool's blocks (`shares_blocks`);
- its CUDA-graph support (`graph_blocker`: why decode steps must stay eager, None when they replay);
- its runtime part: what it bounds once the scheduler exists (`attach`), what it does after each
  step (`after_step`), its checks (`checks`, validation/runner.ApproximationCheck) and its
  sections of the stats feed (`feed`).
The runner, the KV cache, the graphs and the step hooks loop over one registry
(strategies/registry.py) and never ask a strategy by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import nn

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.core.cache_spec import KVCacheSpec
from kvpilot.engine.core.pools import BlockManagerLike
from kvpilot.engine.core.scheduler import Scheduler, SchedulerOutput
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.metrics.stats_contract import FeedSections
from kvpilot.engine.validation.runner import ApproximationCheck, ValidatedRunner

Requeue = Callable[[Sequence], None]  # recompute a running sequence from token 0 (the engine's)
WeightTransform = Callable[[str, torch.Tensor], torch.Tensor]  # (checkpoint name, tensor) -> tensor to load


class KVLayoutView(Protocol):
    """What strategies read of the KV layout (worker/kv_cache.KVLayout)."""

    kind: str  # 'model', a 16/32-bit name, 'int8', 'fp8', 'auto-switch'
    quant: str | None

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def is_quantised(self) -> bool: ...


class LatentView(Protocol):
    """What strategies read of the MLA state (strategies/mla/apply.MlaState)."""

    mode: str  # 'native', 'converted', 'off'
    latent_width: int | None
    absorbed_decode: bool


class StateView(Protocol):
    """What strategies read of the recurrent-state cache (worker/state_cache.LinearState)."""

    layers: list[nn.Module]

    def stats(self) -> dict[str, int]: ...


class CacheView(Protocol):
    """What strategies read of the allocated cache (worker/kv_cache.KVCache)."""

    exact_block_bytes: int  # one block of a conversion's K/V reserve (0: none)


class RunnerView(ValidatedRunner, Protocol):
    """The model runner as strategies see it (worker/model_runner.ModelRunner): what validation reads,
    plus the KV layout, pools and strategy state."""

    config: EngineConfig
    world: int
    block_size: int
    kv_model_config: ModelConfig  # every rank's KV heads (tensor parallel)
    num_kv_blocks: int
    cache: CacheView
    kv_layout: KVLayoutView
    kv_pool_sizes: tuple[int, ...]
    mla: LatentView
    linear_state: StateView | None

    @property
    def bytes_per_block(self) -> int: ...


@dataclass(frozen=True)
class ConversionReserve:
    """A conversion's fallback reserve: `share` of the KV memory held as K/V blocks of the unconverted
    layers, with `kv_heads` heads (0: the served model's own)."""

    share: float
    kv_heads: int = 0


class MemoryStrategy:
    """One memory strategy's contract; every hook's default is 'this strategy changes nothing'.

    Built once per engine from the config and the checkpoint's model config (before a conversion
    changes what is served); `enabled` says whether it does anything for this engine.
    """

    name: ClassVar[str]

    def __init__(self, config: EngineConfig, checkpoint: ModelConfig) -> None:
        self.config = config
        self.checkpoint = checkpoint

    @property
    def enabled(self) -> bool:
        return False

    # -- load ----------------------------------------------------------------------------
    def weight_transform(self, served: ModelConfig) -> WeightTransform | None:
        """A transform of checkpoint tensors as they load (None: loaded as they are)."""
        return None

    def load(self, runner: RunnerView, world: int) -> None:
        """After the weights load: convert the model in place (`world`: tensor-parallel ranks)."""

    # -- KV cache ------------------------------------------------------------------------
    def cache_spec(self, spec: KVCacheSpec, runner: RunnerView) -> KVCacheSpec:
        """A paged layer's cache spec with this strategy applied (unchanged by default)."""
        return spec

    def conversion_reserve(self, runner: RunnerView) -> ConversionReserve | None:
        """The unconverted K/V reserve a conversion keeps beside its converted blocks (None: none)."""
        return None

    def shares_blocks(self, runner: RunnerView) -> bool:
        """Whether its exact path runs over the same blocks as its approximation (so a fallback reserve
        partitions one pool rather than adding a second)."""
        return False

    # -- CUDA graphs ---------------------------------------------------------------------
    def graph_blocker(self, runner: RunnerView) -> str | None:
        """Why this strategy keeps every decode step eager (None: its steps can be captured)."""
        return None

    # -- runtime ----------------------------------------------------------------------------
    def attach(self, block_manager: BlockManagerLike, scheduler: Scheduler, max_model_len: int) -> None:
        """Once the block manager and scheduler exist: check the pool fits, bound what the scheduler does."""

    def after_step(self, out: SchedulerOutput) -> None:
        """After each engine step (validation has run): e.g. evict what fell out of the window."""

    def checks(
        self, runner: RunnerView, block_manager: BlockManagerLike, requeue: Requeue
    ) -> list[ApproximationCheck]:
        """Its approximations' runtime checks (validation/runner.py)."""
        return []

    def feed(self, runner: RunnerView) -> FeedSections:
        """Its typed sections of the stats feed (metrics/stats_contract.FeedSections, the keywords of
        the one assembler metrics/stats.build_feed)."""
        return {}
