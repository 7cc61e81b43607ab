"""The MLA strategy of an engine: native DeepSeek MLA (absorbed decode) or MLA conversion of MHA/GQA.

- DeepSeek-V2/V3 checkpoints always cache the latent; decode is absorbed through the mla_decode
  kernel, or, with `disable_mla`, decompressed like prefill (the checkpoint's own formulation).
- `attention="mla"` with `latent_rank=r` on a Llama/Mistral/Qwen2 checkpoint factorises K/V by SVD
  into a shared rank-r latent at load (strategies/mla/attention.py; with `conversion_calibration`
  weighted by the inputs and by what the queries and o_proj make of K/V, weighting.py), logs the reconstruction error and
  reports it in the stats feed's `engine.mla` section; `disable_mla` serves the original attention.
  Its decode absorbs W_UV but decompresses K (RoPE rotates every key dim), so the feed's
  `absorbed_decode`, which means both sides absorbed, stays false for it.
- With `mla_rope_dims=R` the conversion keeps RoPE on R dims per KV head only (cached exactly beside
  the latent: row width r + Hkv x R) and drops it on the factorised dims, so decode absorbs both
  W_UK and W_UV (strategies/mla/partial.py, absorbed.py) and `absorbed_decode` is true.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torch import nn

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.config.strategy import conversion_rank

log = logging.getLogger("kvpilot.engine.mla")


@dataclass(frozen=True)
class MlaState:
    """What the engine runs: `mode` 'native' (DeepSeek), 'converted' or 'off'; errors per layer."""

    mode: str
    latent_width: int | None
    absorbed_decode: bool
    latent_rank: int | None = None
    errors_k: tuple[float, ...] = ()
    errors_v: tuple[float, ...] = ()
    errors: tuple[float, ...] = ()

    def stats(self) -> dict[str, Any]:
        """The feed's `engine.mla`: mean and worst relative Frobenius error of the K/V factorisation."""

        def mean(xs: tuple[float, ...]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        return {
            "mode": self.mode,
            "latent_width": self.latent_width,
            "absorbed_decode": self.absorbed_decode,
            "latent_rank": self.latent_rank,
            "reconstruction_error": mean(self.errors),
            "reconstruction_error_max": max(self.errors) if self.errors else None,
            "reconstruction_error_k": mean(self.errors_k),
            "reconstruction_error_v": mean(self.errors_v),
        }


def apply_mla(model: nn.Module, config: EngineConfig, model_config: ModelConfig) -> MlaState:
    """Set up the model's MLA after its weights are loaded (converts in place); logs what it did."""
    if model_config.deepseek is not None:
        absorbed = not config.disable_mla
        model.set_absorb(absorbed)  # type: ignore[operator]
        log.info(
            "mla: native %s latent width %d, absorbed decode %s",
            model_config.family,
            model_config.deepseek.latent_width,
            absorbed,
        )
        return MlaState("native", model_config.deepseek.latent_width, absorbed)
    rank = conversion_rank(config, model_config)
    if rank is None:
        return MlaState("off", None, False)
    from kvpilot.engine.strategies.calibration.capture import attention_inputs, calibration_tokens
    from kvpilot.engine.strategies.mla.convert import convert_to_mla

    ids = calibration_tokens(config)  # activation-aware factorisation on calibration text (svd.py)
    device = next(model.parameters()).device
    inputs = None if ids is None else attention_inputs(model, ids, list(range(len(model.model.layers))), device)
    rope_dims = config.mla_rope_dims
    convs = convert_to_mla(model, rank, inputs, rope_dims, config.mla_rope_pairs)
    state = MlaState(
        "converted", model.latent_cache_width, rope_dims is not None, rank,
        tuple(c.error_k for c in convs), tuple(c.error_v for c in convs), tuple(c.error for c in convs),
    )  # fmt: skip
    stats = state.stats()
    rope = "RoPE on every dim" if rope_dims is None else f"RoPE on {rope_dims} dims per KV head, absorbed decode"
    log.warning(
        "mla conversion latent_rank=%d (%s) over %d layers (%s): relative K/V weight reconstruction error mean "
        "%.4f, max %.4f (K %.4f, V %.4f)", rank, rope, len(convs),
        "plain SVD" if ids is None else f"activation-aware on {len(ids)} calibration tokens"
        + ("" if rope_dims is not None else ", weighted by the queries' pair energy and o_proj"),
        stats["reconstruction_error"],
        stats["reconstruction_error_max"], stats["reconstruction_error_k"], stats["reconstruction_error_v"],
    )  # fmt: skip
    return state
