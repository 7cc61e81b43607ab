"""Sliding-window attention (Mistral's `sliding_window`): where the engine applies it, and the limit where not.

HF Mistral (and a Llama-architecture config that sets `sliding_window`) lets the query at position p
see the keys p - window < j <= p in every layer. The plain attention layer applies that window on its
16-bit paged kernels and its dense path (layers/attention.py, kernels/paged_*), so such a model serves
past its window with the outputs HF gives. The other attention paths (the 8-bit caches' kernels, the
memory strategies' layers) attend over the whole context, and eviction that keeps sink tokens or fewer
than window - 1 recent ones leaves gaps in the view the kernels count the window in: there the engine
keeps every sequence within the window, where the two agree.
Without eviction the KV cache holds every token of a sequence; `--eviction sinks --eviction-sinks 0
--eviction-window W` frees the blocks that left the window (Mistral's rolling buffer, at block granularity).
"""

from __future__ import annotations

from kvpilot.engine.config.engine import EngineConfig
from kvpilot.engine.config.model import ModelConfig
from kvpilot.engine.config.strategy import SIXTEEN_BIT_KINDS, kv_cache_kind
from kvpilot.strategy_schema import SLIDING_WINDOW_FAMILIES, sliding_window_gap


def layer_window(model: ModelConfig) -> int:
    """The window each attention layer of this model applies: 0 for none (full causal attention)."""
    if model.sliding_window and model.family in SLIDING_WINDOW_FAMILIES:
        return int(model.sliding_window)
    return 0


def window_not_applied(config: EngineConfig, model: ModelConfig) -> str:
    """Why this engine configuration cannot apply the model's sliding window; '' when it can (or there is none)."""
    rolled_back = getattr(config, f"disable_{config.attention}", False)  # the checkpoint's own attention
    kind = kv_cache_kind(config)
    return sliding_window_gap(model.family, int(model.sliding_window or 0),
                              "native" if rolled_back else config.attention, kind, kind in SIXTEEN_BIT_KINDS,
                              config.eviction, config.eviction_sinks, config.eviction_window, config.block_size)


def window_limit(config: EngineConfig, model: ModelConfig) -> int | None:
    """The max_model_len the sliding window imposes (None: none), or ValueError when the user asked for more."""
    why = window_not_applied(config, model)
    if not why:
        return None
    window = int(model.sliding_window or 0)
    if config.max_model_len is not None and config.max_model_len > window:
        raise ValueError(
            f"max_model_len {config.max_model_len} is past the model's sliding window ({window} tokens), and here "
            f"{why}; kvpilot applies the window with native attention, a 16-bit KV cache (kv_cache_dtype auto, "
            f"bf16 or fp16) and no eviction or sinks eviction of the oldest blocks only, on Llama/Mistral "
            f"checkpoints. Use one of those, or max_model_len <= {window}"
        )
    return window
