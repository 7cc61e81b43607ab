"""DeepSeek-V2/V3 decoder with multi-head latent attention (MLA) over a paged latent cache.

Per token and layer the cache holds `c_kv` (kv_a_proj_with_mqa's first kv_lora_rank outputs after
kv_a_layernorm) followed by the shared RoPE key `k_pe` (after RoPE): the layout of
kernels/mla_decode. Prefill decompresses the cached latent with kv_b_proj into per-head K/V (as HF
does); decode absorbs W_UK into the query and W_UV into the output and runs the mla_decode kernel
(Triton on CUDA / under TRITON_INTERPRET, torch reference on CPU). `absorb=False` (--disable-mla)
decodes through the decompressing path instead. Math and parameter names follow HF transformers'
modeling_deepseek_v2.py / modeling_deepseek_v3.py (5.x).
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.config.deepseek import DeepseekFields
from kvpilot.engine.kernels.mla_rope import mla_rope
from kvpilot.engine.layers.latent_attention import LatentAttention
from kvpilot.engine.models.causal_lm import CausalLM
from kvpilot.engine.models.layers import RMSNorm, SiluAndMulMLP
from kvpilot.engine.models.moe import DeepseekMoE

LORA_NORM_EPS = 1e-6  # HF builds q_a_layernorm / kv_a_layernorm with the RMSNorm default, not rms_norm_eps
LAYER_PREFIX = re.compile(r"model\.layers\.(\d+)\.")


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def deepseek_rope(dim: int, theta: float, yarn: dict | None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of the rope dims and the cos/sin attention factor (YaRN, as HF computes)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    inv_freq = 1.0 / pos_freqs
    if not yarn:
        return inv_freq, 1.0
    factor = float(yarn["factor"])
    mscale, mscale_all = yarn.get("mscale"), yarn.get("mscale_all_dim")
    attention_factor = yarn.get("attention_factor")
    if attention_factor is None:
        if mscale and mscale_all:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = yarn.get("beta_fast") or 32
    beta_slow = yarn.get("beta_slow") or 1
    old_len = yarn["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if yarn.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq, float(attention_factor)


def softmax_scale(f: DeepseekFields) -> float:
    """HF's `scaling`: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN."""
    scale = f.qk_head_dim**-0.5
    if f.rope_yarn and f.rope_yarn.get("mscale_all_dim"):
        m = yarn_mscale(float(f.rope_yarn["factor"]), float(f.rope_yarn["mscale_all_dim"]))
        scale *= m * m
    return scale


class DeepseekRotary(nn.Module):
    """RoPE on the rope dims: interleaved pairs (2i, 2i+1) or rotate-half pairs (i, i + R/2).

    Interleaved output keeps the pair layout (V2's complex form); V3's interleaved form writes evens
    then odds, a permutation applied to q and k alike, so every q.k (and the cached k_pe's meaning
    to this engine) is the same.
    """

    def __init__(self, dim: int, theta: float, yarn: dict | None, interleave: bool) -> None:
        super().__init__()
        self.dim, self.theta, self.yarn, self.interleave = dim, theta, yarn, interleave
        inv_freq, self.attention_factor = deepseek_rope(dim, theta, yarn)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def restore(self, device: torch.device) -> None:
        self.inv_freq = deepseek_rope(self.dim, self.theta, self.yarn)[0].to(device)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [T, heads, R] at positions [T] (kernels/mla_rope: Triton on CUDA, the torch reference elsewhere)."""
        return mla_rope(positions, self.inv_freq, x, self.attention_factor, self.interleave)


class DeepseekAttention(nn.Module):
    """MLA: q (direct or through q_lora), the latent c_kv + shared k_pe cached, kv_b_proj expands."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        f = config.deepseek
        assert f is not None
        self.f = f
        self.num_heads = config.num_attention_heads
        hidden, heads, bias = config.hidden_size, config.num_attention_heads, config.attention_bias
        if f.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * f.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, f.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(f.q_lora_rank, LORA_NORM_EPS)
            self.q_b_proj = nn.Linear(f.q_lora_rank, heads * f.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, f.kv_lora_rank + f.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(f.kv_lora_rank, LORA_NORM_EPS)
        self.kv_b_proj = nn.Linear(f.kv_lora_rank, heads * (f.qk_nope_head_dim + f.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * f.v_head_dim, hidden, bias=bias)
        self.rotary_emb = DeepseekRotary(
            f.qk_rope_head_dim, config.rope_theta, f.rope_yarn, f.rope_interleave
        )
        self.attn = LatentAttention(heads, f.latent_width, softmax_scale(f), rope_split=f.kv_lora_rank)
        self.absorb = True

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        f, t, heads = self.f, x.shape[0], self.num_heads
        if f.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(t, heads, f.qk_head_dim)
        q_nope, q_pe = q.split([f.qk_nope_head_dim, f.qk_rope_head_dim], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([f.kv_lora_rank, f.qk_rope_head_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)
        q_pe = self.rotary_emb(positions, q_pe)
        k_pe = self.rotary_emb(positions, k_pe[:, None, :])[:, 0]
        query = torch.cat((q_nope, q_pe), dim=-1)
        latent = torch.cat((c_kv, k_pe), dim=-1)
        o = self.attn(query, latent, positions, self._expand, self._absorbed_decode if self.absorb else None)
        return self.o_proj(o.reshape(t, heads * f.v_head_dim))

    def _expand(self, rows: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rows [n, L + R] -> key [n, H, Dn + R] = [c W_UK^T ; k_pe], value [n, H, Dv] = c W_UV^T."""
        f, n = self.f, rows.shape[0]
        c_kv, k_pe = rows.split([f.kv_lora_rank, f.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(c_kv).view(n, self.num_heads, f.qk_nope_head_dim + f.v_head_dim)
        k_nope, value = kv.split([f.qk_nope_head_dim, f.v_head_dim], dim=-1)
        key = torch.cat((k_nope, k_pe[:, None, :].expand(-1, self.num_heads, -1)), dim=-1)
        return key, value

    def _absorbed_decode(
        self, q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor
    ) -> torch.Tensor:
        """One query per sequence: q_nope W_UK -> latent query; mla_decode; latent output W_UV^T."""
        from kvpilot.engine.kernels.mla_decode.ops import mla_decode

        f = self.f
        w = self.kv_b_proj.weight.view(self.num_heads, f.qk_nope_head_dim + f.v_head_dim, f.kv_lora_rank)
        w_uk, w_uv = w[:, : f.qk_nope_head_dim], w[:, f.qk_nope_head_dim :]
        q_nope, q_pe = q.split([f.qk_nope_head_dim, f.qk_rope_head_dim], dim=-1)
        # head-batched GEMMs over strided views ([H, B, .] of [B, H, .]): no permute copies; mla_decode reads
        # q_latent through its strides
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1).to(cache.dtype)
        if q_latent.stride(-1) != 1:
            q_latent = q_latent.contiguous()
        o_latent = mla_decode(
            q_latent, q_pe.to(cache.dtype).contiguous(), cache, block_tables, context_lens, self.attn.scale
        )
        return torch.bmm(o_latent.to(q.dtype).transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        f = config.deepseek
        assert f is not None
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DeepseekAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = (
            DeepseekMoE(config.hidden_size, f)
            if layer_idx >= f.first_k_dense_replace
            else SiluAndMulMLP(config.hidden_size, config.intermediate_size)
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(positions, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekV2ForCausalLM(CausalLM):
    """Packed-token causal LM over an MLA latent cache (also DeepSeek-V3: routing from the config)."""

    def __init__(self, config: ModelConfig) -> None:
        if config.deepseek is None:
            raise ValueError(f"model family {config.family!r} has no DeepSeek MLA fields (kv_lora_rank, ...)")
        super().__init__(config, (DeepseekDecoderLayer(config, i) for i in range(config.num_hidden_layers)))
        self.latent_cache_width = config.deepseek.latent_width

    def checkpoint_skip_reason(self, name: str) -> str | None:
        """Why the loader may skip a checkpoint tensor with no parameter here: only V3's MTP layers."""
        return mtp_skip_reason(
            name, self.config.num_hidden_layers, self.config.deepseek.num_nextn_predict_layers
        )

    def restore_buffers(self, device: torch.device) -> None:
        """Recompute the RoPE frequencies after the meta-device build (buffers are not in checkpoints)."""
        for layer in self.model.layers:
            layer.self_attn.rotary_emb.restore(device)

    def set_absorb(self, absorb: bool) -> None:
        for layer in self.model.layers:
            layer.self_attn.absorb = absorb

    def attention_layers(self) -> list[LatentAttention]:
        return [layer.self_attn.attn for layer in self.model.layers]


def mtp_skip_reason(name: str, num_hidden_layers: int, num_nextn: int) -> str | None:
    """The reason to skip `name` when it belongs to a multi-token-prediction layer, else None.

    DeepSeek-V3 stores its MTP modules as `model.layers.{num_hidden_layers + i}.*` for
    i < num_nextn_predict_layers; they draft extra tokens for speculative decoding, which kvpilot
    does not do, so their weights are not needed to generate.
    """
    match = LAYER_PREFIX.match(name)
    if num_nextn <= 0 or match is None:
        return None
    if not num_hidden_layers <= int(match.group(1)) < num_hidden_layers + num_nextn:
        return None
    last = num_hidden_layers + num_nextn - 1
    return (
        f"multi-token-prediction layer(s) {num_hidden_layers}..{last} (num_nextn_predict_layers={num_nextn}) "
        "are not used: kvpilot decodes one token per step"
    )
