"""The GQA conversion beside its fallback reserve: merged heads for most sequences, the checkpoint's own for the rest.

With `fallback_reserve > 0` every converted layer keeps its original K/V projections (their bytes
are counted by the capacity planner) and the pool keeps a reserve of K/V blocks with the checkpoint's
own KV heads (worker/kv_cache.py). A step is split by pool (layers/reserve_attention.py): reserve
tokens use the original projections and attend over full-head K/V, the rest the merged heads. A
sequence that fails runtime validation (strategies/gqa/check.py) moves to the reserve and is served
unmerged from then on. Calibrated grouping permutes a layer's heads: the original projections are
permuted the same way (`kv_head_order`), which changes nothing in the unmerged attention; its
query/value compensation changed q_proj (the kept keys follow, compensate.exact_kv) and o_proj (the
reserve's rows use the original, kept beside the K/V projections).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.context import get_context
from kvpilot.engine.layers.reserve_attention import attend_with_reserve
from kvpilot.engine.strategies.gqa.compensate import exact_kv


def gqa_reserve_applies(config, original_kv_heads: int, world: int) -> bool:
    """Whether the engine keeps an unmerged fallback path: a GQA conversion that merges heads, a
    reserve share, one device."""
    groups = None if config.attention != "gqa" or config.disable_gqa else config.kv_head_groups
    return groups is not None and groups < original_kv_heads and config.fallback_reserve > 0 and world == 1


class GqaReserveAttention(nn.Module):
    """A merged LlamaAttention plus its original K/V projections for sequences on the reserve."""

    def __init__(self, src: nn.Module, original: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.src = src
        d = src.head_dim
        order = getattr(src, "kv_head_order", None)
        heads = original["k_proj.weight"].shape[0] // d
        rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in (order or range(heads))])
        device, dtype = src.k_proj.weight.device, src.k_proj.weight.dtype
        # calibrated compensation changed q_proj (the kept keys follow it, exact_kv) and o_proj (the reserve's
        # rows use the original one)
        comp = getattr(src, "gqa_compensation", None)
        kept = exact_kv({k: t[rows] for k, t in original.items()}, comp)
        for name in ("k_proj", "v_proj"):
            bias = kept.get(f"{name}.bias")
            self.register_buffer(f"{name}_weight", kept[f"{name}.weight"].to(device, dtype))
            self.register_buffer(f"{name}_bias", None if bias is None else bias.to(device, dtype))
        output = None if comp is None else comp.output_weight
        self.register_buffer("o_proj_weight", None if output is None else output.to(device, dtype))
        self.original_kv_heads = heads

    # what the engine and the runtime check read from a layer's self_attn
    @property
    def attn(self) -> nn.Module:
        return self.src.attn

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["src"], name)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        src = self.src
        if not getattr(src.attn, "first_latent", 0) or get_context().dense:
            return src(positions, x)
        t = x.shape[0]
        q = src.q_proj(x).view(t, src.num_heads, src.head_dim)
        q, _ = src.rotary_emb(positions, q, q[:, :1])
        o = attend_with_reserve(q, x, positions, src.attn, self._original_kv, self._merged, src.attn.k_cache.shape[1])
        o = o.reshape(t, src.num_heads * src.head_dim)
        out = src.o_proj(o)
        if self.o_proj_weight is not None:  # value compensation: the reserve's heads need the original o_proj
            for part in get_context().kv_split.parts:
                if not part.quant:
                    out[part.rows] = F.linear(o[part.rows], self.o_proj_weight)
        return out

    def _original_kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, d = x.shape[0], self.src.head_dim
        k = F.linear(x, self.k_proj_weight, self.k_proj_bias).view(n, self.original_kv_heads, d)
        v = F.linear(x, self.v_proj_weight, self.v_proj_bias).view(n, self.original_kv_heads, d)
        k, _ = self.src.rotary_emb(positions, k, k[:, :1])
        return k, v

    def _merged(self, q: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        src = self.src
        n = x.shape[0]
        k = src.k_proj(x).view(n, src.num_kv_heads, src.head_dim)
        v = src.v_proj(x).view(n, src.num_kv_heads, src.head_dim)
        k, _ = src.rotary_emb(positions, k, k[:, :1])
        return src.attn(q, k, v)


def wrap_for_reserve(model: nn.Module, originals: dict[str, torch.Tensor]) -> int:
    """Give every converted layer its original K/V projections (GqaReserveAttention); how many."""
    wrapped = 0
    for index, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{index}.self_attn."
        original = {k.removeprefix(prefix): t for k, t in originals.items() if k.startswith(prefix)}
        if original:
            layer.self_attn = GqaReserveAttention(layer.self_attn, original)
            wrapped += 1
    return wrapped
