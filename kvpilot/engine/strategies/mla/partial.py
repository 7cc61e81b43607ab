"""Partial-RoPE MLA conversion (`mla_rope_dims` R): RoPE kept on R dims per KV head, dropped elsewhere, so decode absorbs.

MHA2MLA's recipe without its fine-tuning. Per KV head, R dims (whole rotate-half pairs, rope_select.py)
keep their exact key projection and RoPE; they are cached post-RoPE beside the latent. The other D - R
dims go through the shared latent (svd.py) and are used WITHOUT rotation, on the query side too: the
layer is an approximation of the checkpoint even at full rank (rope_dims = head_dim and full rank
reproduce it exactly). With no rotation on the factorised dims, W_UK absorbs into the query and W_UV
into the output as in DeepSeek's MLA, and decode reads only the cached rows (absorbed.py).

Query layout of the latent path: [q_nope (D - R, before RoPE) ; q_rope (R, after RoPE)] per head; keys
the same order, [W_UK c + b_nope ; k_rope]. Prefill decompresses that key (layers/latent_attention.py);
runtime validation's exact side and the fallback reserve use the checkpoint's own attention, as in
the exact-RoPE conversion.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.layers.latent_attention import LatentAttention
from kvpilot.engine.models.llama import LlamaAttention
from kvpilot.engine.strategies.mla.absorbed import (
    absorb_query,
    latent_attention_torch,
    latent_attention_triton,
    project_values,
)
from kvpilot.engine.strategies.mla.attention import ConvertedMlaAttention
from kvpilot.engine.strategies.mla.decode import DecodePlanner
from kvpilot.engine.strategies.mla.rope_select import high_frequency_pairs, norm_pairs, turn_pairs
from kvpilot.engine.strategies.mla.svd import MlaConversion


@torch.no_grad()
def choose_pairs(src: LlamaAttention, x: torch.Tensor | None, rope_dims: int, rule: str, length: int) -> torch.Tensor:
    """The rotate-half pairs [Hkv, rope_dims/2] each KV head keeps RoPE on, by `rule` (rope_select.py;
    resolved: high, norm or turn); norm and turn score the layer's calibration inputs x [T, hidden],
    turn over distances up to `length` (the longest context served)."""
    if rule == "high":
        return high_frequency_pairs(src.num_kv_heads, rope_dims)
    assert x is not None, f"mla_rope_pairs={rule!r} needs calibration inputs"
    xf = x.to(src.q_proj.weight.device).float()
    q = F.linear(xf, src.q_proj.weight.float(), _float(src.q_proj.bias)).view(-1, src.num_heads, src.head_dim)
    k = F.linear(xf, src.k_proj.weight.float(), _float(src.k_proj.bias)).view(-1, src.num_kv_heads, src.head_dim)
    if rule == "norm":
        return norm_pairs(q, k, rope_dims).cpu()
    return turn_pairs(q, k, rope_dims, src.rotary_emb.inv_freq, length).cpu()


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


class PartialRopeMlaAttention(ConvertedMlaAttention):
    """Cached row [latent c (r) ; rope keys (Hkv x R)]; decode absorbed when `batched_decode` (the default)."""

    def __init__(self, src: LlamaAttention, conv: MlaConversion, planner: DecodePlanner | None = None) -> None:
        super().__init__(src, conv, planner)
        kv_heads, head_dim = self.num_kv_heads, self.head_dim
        self.rope_dims = conv.rope_index.shape[1]
        self.rank = conv.rank
        device = src.k_proj.weight.device
        group = self.num_heads // kv_heads
        rope_index, nope_index = conv.rope_index.to(device), conv.nope_index.to(device)
        self.register_buffer("rope_index", rope_index)  # [Hkv, R]
        self.register_buffer("q_rope_index", rope_index.repeat_interleave(group, dim=0)[None])  # [1, H, R]
        self.register_buffer("q_nope_index", nope_index.repeat_interleave(group, dim=0)[None])  # [1, H, D-R]
        # the kept key dims are the checkpoint's own k_proj rows (conv.k_rope), and k_proj stays for validation
        # and the reserve: `_rope_keys` projects through it, so no copy of those rows is held
        bias = src.k_proj.bias
        rows = None if bias is None else bias.detach().view(kv_heads, head_dim)
        self.register_buffer("k_bias", None if rows is None else rows.gather(1, nope_index).reshape(-1))
        self.attn = LatentAttention(self.num_heads, self.rank + kv_heads * self.rope_dims, src.attn.scale)

    def _serve(self, q: torch.Tensor, q_rot: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._latent(self._query(q, q_rot), x, positions)

    def _reserve_latent(self, q_rot: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # the reserve hands over the rotated query only: the unrotated dims are projected again (these rows)
        q = self.q_proj(x).view(x.shape[0], self.num_heads, self.head_dim)
        return self._latent(self._query(q, q_rot), x, positions)

    def _query(self, q: torch.Tensor, q_rot: torch.Tensor) -> torch.Tensor:
        """[q_nope ; q_rope] [T, H, D]: the factorised dims before RoPE, the kept dims after."""
        t = q.shape[0]
        q_nope = q.gather(2, self.q_nope_index.expand(t, -1, -1))
        q_rope = q_rot.gather(2, self.q_rope_index.expand(t, -1, -1))
        return torch.cat([q_nope, q_rope], dim=-1)

    def _latent(self, q: torch.Tensor, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        latent = torch.cat([F.linear(x, self.down), self._rope_keys(x, positions)], dim=-1)
        decode = self._decode if self.batched_decode else None
        return self.attn(q, latent, positions, self._expand, decode)

    def _rope_keys(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The kept key dims after RoPE [T, Hkv*R]: the checkpoint's keys through the model's own rotary,
        the kept dims gathered (three ops: at decode the projection's extra rows cost less than the
        scatter into a zero head it replaces)."""
        t, kv_heads = x.shape[0], self.num_kv_heads
        k = self.k_proj(x).view(t, kv_heads, self.head_dim)
        k, _ = self.rotary_emb(positions, k, k[:, :1])
        return k.gather(2, self.rope_index.expand(t, -1, -1)).reshape(t, kv_heads * self.rope_dims)

    def _expand(self, rows: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rows -> key [n, Hkv, D] = [W_UK c + b_nope ; k_rope], value [n, Hkv, Dv] (no RoPE to apply)."""
        n, kv_heads = rows.shape[0], self.num_kv_heads
        latent, rope = rows[:, : self.rank], rows[:, self.rank :]
        k_nope = F.linear(latent, self.up_k, self.k_bias).view(n, kv_heads, self.head_dim - self.rope_dims)
        key = torch.cat([k_nope, rope.reshape(n, kv_heads, self.rope_dims)], dim=-1)
        value = F.linear(latent, self.up_v, self.v_bias).view(n, kv_heads, -1)
        return key, value

    def _decode(
        self, q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor
    ) -> torch.Tensor:
        """Absorbed decode, one query per sequence [B, H, D] -> [B, H, Dv] (absorbed.py)."""
        q_nope, q_rope = q.split([self.head_dim - self.rope_dims, self.rope_dims], dim=-1)
        q_latent = absorb_query(q_nope, self.up_k, self.num_kv_heads)
        o_latent = None
        if self.kernel_decode and backend_for(q) == "triton":
            o_latent = self.kernel_or_none(
                latent_attention_triton, q_latent, q_rope, cache, block_tables, context_lens, self.attn.scale,
                self.num_kv_heads,
            )  # fmt: skip
        if o_latent is not None:
            o_latent = o_latent.to(q.dtype)
        else:
            plan = self.planner.plan(block_tables, context_lens, cache.shape[1], q.dtype)
            rows = plan.gather(cache).to(q.dtype)
            o_latent = latent_attention_torch(q_latent, q_rope, rows, plan, self.attn.scale, self.num_kv_heads)
        return project_values(o_latent, self.up_v, self.v_bias, self.num_kv_heads).to(q.dtype)
