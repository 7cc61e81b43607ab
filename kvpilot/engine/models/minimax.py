"""MiniMax-style hybrid decoder (HF `MiniMaxForCausalLM`): lightning-attention layers with a
per-sequence recurrent state beside softmax layers on the paged KV cache, and a sparse MoE MLP.

Read off HF `modeling_minimax.py`: the residual of both sublayers is the *normed* input, scaled by
alpha, plus the sublayer's output scaled by beta. Lightning layers: silu(qkv_proj(h)) split per
head into q, k, v (interleaved per head), the lightning kernels over the state pool (no RoPE, no
scale, no softmax), one RMSNorm (eps 1e-6) over all heads, a sigmoid output gate from h, out_proj.
Softmax layers: GQA with full RoPE (HF's MiniMax rotary covers the whole head_dim).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.config.minimax import LINEAR
from kvpilot.engine.context import get_context
from kvpilot.engine.kernels.lightning_attn.ops import lightning_decode, lightning_prefill
from kvpilot.engine.kernels.lightning_attn.reference import minimax_slopes
from kvpilot.engine.layers.attention import Attention
from kvpilot.engine.models.causal_lm import CausalLM
from kvpilot.engine.models.layers import RMSNorm
from kvpilot.engine.models.llama import LlamaAttention
from kvpilot.engine.models.moe import MINIMAX_EXPERT_NAMES, StackedExperts

LIGHTNING_NORM_EPS = 1e-6  # HF's MiniMaxRMSNorm default, not config.rms_norm_eps


class LightningAttention(nn.Module):
    """One lightning-attention layer; its state pool [num_slots, H, D, D] fp32 is set by the runner."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.layer_idx = layer_idx
        self.num_layers = config.num_hidden_layers
        inner = self.num_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * inner, bias=False)
        self.output_gate = nn.Linear(config.hidden_size, inner, bias=False)
        self.out_proj = nn.Linear(inner, config.hidden_size, bias=False)
        self.norm = RMSNorm(inner, LIGHTNING_NORM_EPS)
        self.state_pool = torch.empty(0)
        self._slopes: torch.Tensor | None = None  # a plain attribute: no checkpoint entry, survives to_empty

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One sequence's state in this layer: [H, Dk, Dv]."""
        return (self.num_heads, self.head_dim, self.head_dim)

    def slopes(self, device: torch.device) -> torch.Tensor:
        if self._slopes is None or self._slopes.device != device:
            slopes = minimax_slopes(self.num_heads, self.layer_idx, self.num_layers)
            self._slopes = slopes.float().to(device)
        return self._slopes

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        t = h.shape[0]
        qkv = F.silu(self.qkv_proj(h)).view(t, self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        o = self._attend(q, k, v)
        o = self.norm(o.reshape(t, self.num_heads * self.head_dim))
        o = torch.sigmoid(self.output_gate(h)) * o
        return self.out_proj(o)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        slopes = self.slopes(q.device)
        if ctx.dense:  # one sequence, no pool (scoring, profiling): a zero state of its own
            state = torch.zeros((1, *self.state_shape), dtype=torch.float32, device=q.device)
            cu = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
            slot = torch.zeros(1, dtype=torch.int32, device=q.device)
            return lightning_prefill(q, k, v, cu, slopes, state, slot)
        n = ctx.num_prefill_tokens
        if n == q.shape[0]:
            return lightning_prefill(q, k, v, ctx.cu_seqlens_q, slopes, self.state_pool, ctx.linear_slots)
        if n == 0:
            return lightning_decode(q, k, v, slopes, self.state_pool, ctx.decode_linear_slots)
        o = torch.empty_like(v)
        o[:n] = lightning_prefill(
            q[:n], k[:n], v[:n], ctx.cu_seqlens_q, slopes, self.state_pool, ctx.linear_slots
        )
        o[n:] = lightning_decode(q[n:], k[n:], v[n:], slopes, self.state_pool, ctx.decode_linear_slots)
        return o


class MiniMaxSparseMoe(nn.Module):
    """Top-k routing over softmax(router logits) in fp32, weights renormalised over the k chosen; the
    experts stacked (models/moe.StackedExperts) from the checkpoint's `experts.N.w{1,2,3}` names."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hybrid = config.hybrid
        assert hybrid is not None
        self.top_k = hybrid.num_experts_per_tok
        self.gate = nn.Linear(config.hidden_size, hybrid.num_local_experts, bias=False)
        self.experts = StackedExperts(
            hybrid.num_local_experts, config.hidden_size, config.intermediate_size, MINIMAX_EXPERT_NAMES
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.experts(x, weights, chosen)


class MiniMaxDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        hybrid = config.hybrid
        assert hybrid is not None
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.is_linear = hybrid.layer_types[layer_idx] == LINEAR
        self.self_attn: nn.Module
        if self.is_linear:
            self.self_attn = LightningAttention(config, layer_idx)
            self.alpha, self.beta = hybrid.linear_attn_alpha_factor, hybrid.linear_attn_beta_factor
        else:
            self.self_attn = LlamaAttention(config, qkv_bias=False)
            self.alpha, self.beta = hybrid.full_attn_alpha_factor, hybrid.full_attn_beta_factor
        self.mlp_alpha, self.mlp_beta = hybrid.mlp_alpha_factor, hybrid.mlp_beta_factor
        self.block_sparse_moe = MiniMaxSparseMoe(config)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = h * self.alpha + self.self_attn(positions, h) * self.beta
        h = self.post_attention_layernorm(x)
        return h * self.mlp_alpha + self.block_sparse_moe(h) * self.mlp_beta


class MiniMaxForCausalLM(CausalLM):
    """Packed-token hybrid causal LM; same interface as LlamaForCausalLM plus linear_layers()."""

    def __init__(self, config: ModelConfig) -> None:
        if config.hybrid is None:
            raise ValueError(
                "MiniMaxForCausalLM needs the hybrid fields of config.json (layer_types, experts)"
            )
        super().__init__(config, (MiniMaxDecoderLayer(config, i) for i in range(config.num_hidden_layers)))

    def attention_layers(self) -> list[Attention]:
        """The softmax layers' paged attention, in layer order (they alone use the KV cache)."""
        return [layer.self_attn.attn for layer in self.model.layers if not layer.is_linear]

    def linear_layers(self) -> list[LightningAttention]:
        return [layer.self_attn for layer in self.model.layers if layer.is_linear]
