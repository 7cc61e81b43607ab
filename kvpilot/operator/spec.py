"""An InferenceService spec as typed values, with the CRD's defaults (so builders never guess)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpilot.planner import KVStrategy


@dataclass(frozen=True)
class ModelRef:
    """Where the checkpoint is and how to read its config.json without loading it."""

    uri: str
    sha256: str = ""
    config: Mapping[str, Any] | None = None  # inline config.json
    config_map: str = ""  # or: a ConfigMap holding it
    config_map_key: str = "config.json"


@dataclass(frozen=True)
class StrategySpec:
    """spec.strategy: the memory strategy of the stable track."""

    attention: str = "native"
    kv_head_groups: int | None = None
    latent_rank: int | None = None
    linear_window: int = 64
    kv_cache_dtype: str = "auto"
    max_seq_len: int = 4096
    block_size: int = 16
    eviction: str = "none"
    max_num_batched_tokens: int = 8192

    def planner_strategy(self) -> KVStrategy:
        return KVStrategy(
            attention=self.attention, kv_head_groups=self.kv_head_groups, latent_rank=self.latent_rank,
            kv_cache_dtype=self.kv_cache_dtype, block_size=self.block_size, linear_window=self.linear_window,
        )


@dataclass(frozen=True)
class EngineSpec:
    """spec.engine: the image and extra flags of `kvpilot serve`."""

    image: str = "ghcr.io/kvpilot/kvpilot:latest"
    disable: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    termination_grace_period_seconds: int = 300


@dataclass(frozen=True)
class ServiceSpec:
    """The whole spec of one InferenceService."""

    model: ModelRef
    strategy: StrategySpec = field(default_factory=StrategySpec)
    gpus: int = 1
    gpu_product: str = "NVIDIA-H200"
    replicas: int = 1
    engine: EngineSpec = field(default_factory=EngineSpec)
    rollback: bool = False

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> ServiceSpec:
        model = spec.get("model") or {}
        ref = model.get("configMapRef") or {}
        strategy = {_snake(k): v for k, v in (spec.get("strategy") or {}).items()}
        engine = spec.get("engine") or {}
        resources = spec.get("resources") or {}
        return cls(
            model=ModelRef(
                uri=str(model.get("uri", "")), sha256=str(model.get("sha256", "")),
                config=model.get("config"), config_map=str(ref.get("name", "")),
                config_map_key=str(ref.get("key", "config.json")),
            ),
            strategy=StrategySpec(**{k: v for k, v in strategy.items() if k in StrategySpec.__dataclass_fields__}),
            gpus=int(resources.get("gpus", 1)),
            gpu_product=str(resources.get("gpuProduct", "NVIDIA-H200")),
            replicas=int(spec.get("replicas", 1)),
            engine=EngineSpec(
                image=str(engine.get("image", EngineSpec.image)),
                disable=tuple(engine.get("disable") or ()),
                args=tuple(str(a) for a in engine.get("args") or ()),
                termination_grace_period_seconds=int(
                    engine.get("terminationGracePeriodSeconds", EngineSpec.termination_grace_period_seconds)
                ),
            ),
            rollback=bool(spec.get("rollback", False)),
        )


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
