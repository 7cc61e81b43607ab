"""Llama-architecture decoder (also Mistral, and Qwen2 with QKV bias) over packed tokens."""

from __future__ import annotations

import torch
from torch import nn

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.config.sliding_window import layer_window
from kvpilot.engine.kernels import linear_add_rmsnorm
from kvpilot.engine.layers.attention import Attention
from kvpilot.engine.layers.parallel import MergedLinear, column_linear, row_linear
from kvpilot.engine.models.causal_lm import CausalLM
from kvpilot.engine.models.layers import RMSNorm, RotaryEmbedding, SiluAndMulMLP
from kvpilot.engine.parallel.shard import head_shard
from kvpilot.engine.parallel.state import tp_rank, tp_world


class LlamaAttention(nn.Module):
    """q/k/v/o projections, RoPE, and paged attention; HF parameter names."""

    def __init__(self, config: ModelConfig, qkv_bias: bool) -> None:
        super().__init__()
        # this rank's heads (all of them at one rank); KV heads copied when fewer than ranks
        heads = head_shard(config.num_attention_heads, config.num_key_value_heads, tp_rank(), tp_world())
        self.num_heads, self.num_kv_heads = heads.num_heads, heads.num_kv_heads
        self.head_dim = d = config.head_dim
        hidden = config.hidden_size
        q_width, kv_width = config.num_attention_heads * d, config.num_key_value_heads * d
        self.q_proj = column_linear(hidden, q_width, qkv_bias, heads.q_start * d, self.num_heads * d)
        self.k_proj = column_linear(hidden, kv_width, qkv_bias, heads.kv_start * d, self.num_kv_heads * d)
        self.v_proj = column_linear(hidden, kv_width, qkv_bias, heads.kv_start * d, self.num_kv_heads * d)
        self.o_proj = row_linear(q_width, hidden, False, heads.q_start * d, self.num_heads * d)
        self.rotary_emb = RotaryEmbedding(self.head_dim, config.rope_theta, config.rope_scaling)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)
        self.attn.window = layer_window(config)  # Mistral's sliding window (config/sliding_window.py)
        self.qkv: MergedLinear | None = None  # merge_projections(): q, k and v in one GEMM

    def merge_projections(self) -> None:
        self.qkv = MergedLinear([self.q_proj, self.k_proj, self.v_proj])

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend(positions, x))

    def attend(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The attention output before o_proj, [T, heads x head_dim]."""
        t = x.shape[0]
        if self.qkv is not None:
            q, k, v = self.qkv(x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        # the plain paged layer: the rotary kernel also writes this step's K/V into the cache (one launch)
        store = self.attn.fused_store(v) if type(self.attn) is Attention else None
        q, k = self.rotary_emb(positions, q, k, store)
        o = self.attn(q, k, v, stored=True) if store is not None else self.attn(q, k, v)
        return o.reshape(t, self.num_heads * self.head_dim)


FUSED_GEMV = frozenset({"o_proj", "down_proj"})  # the projections kernels/gemv_norm can take


def _plain_linear(module: nn.Module) -> bool:
    """An unsharded, bias-free nn.Linear without hooks: its weight can go straight to a fused kernel."""
    return (type(module) is nn.Linear and module.bias is None and not module._forward_hooks
            and not module._forward_pre_hooks)  # fmt: skip


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, qkv_bias: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, qkv_bias)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SiluAndMulMLP(config.hidden_size, config.intermediate_size)
        self.fused_gemv_rows = 0  # EngineConfig.fused_gemv_rows (LlamaForCausalLM.fuse_gemv)
        self.fused_gemv: frozenset[str] = FUSED_GEMV  # which of them (EngineConfig.fused_gemv_projections)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.forward_carry(positions, self.input_layernorm(x), x, None)[1]

    def _fused(self, tokens: int) -> tuple[bool, bool]:
        """(o_proj, down_proj) as kernels/gemv_norm launches: a step of few tokens, the plain layer (a
        strategy that wraps self_attn, e.g. the GQA reserve or MLA, keeps the separate ops)."""
        if not 0 < tokens <= self.fused_gemv_rows:
            return False, False
        attn, mlp = self.self_attn, self.mlp
        o = ("o_proj" in self.fused_gemv and type(attn) is LlamaAttention and _plain_linear(attn.o_proj)
             and not attn._forward_hooks and not attn._forward_pre_hooks)  # calibration capture hooks self_attn
        down = "down_proj" in self.fused_gemv and mlp.gate_up is not None and _plain_linear(mlp.down_proj)
        return o, down  # fmt: skip

    def forward_carry(
        self, positions: torch.Tensor, normed: torch.Tensor, x: torch.Tensor, next_norm: RMSNorm | None
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(next_norm(out), out) for this layer's output out (DecoderStack's carry; (None, out) without a
        next norm). The residual adds are fused into the norms after them; with `fused_gemv_rows`, o_proj
        and down_proj are fused with them too (and down_proj with the SiLU before it)."""
        post = self.post_attention_layernorm
        fuse_o, fuse_down = self._fused(normed.shape[0])
        if fuse_o:
            a, x = linear_add_rmsnorm(self.self_attn.attend(positions, normed), self.self_attn.o_proj.weight, x,
                                      post.weight, post.eps)  # fmt: skip
        else:
            a, x = post.add_forward(self.self_attn(positions, normed), x)  # residual add fused into the norm
        if fuse_down and next_norm is not None:
            assert self.mlp.gate_up is not None
            gate_up = self.mlp.gate_up.joined(a)  # [T, gate | up]
            return linear_add_rmsnorm(gate_up, self.mlp.down_proj.weight, x, next_norm.weight, next_norm.eps,
                                      silu_input=True)  # fmt: skip
        h = self.mlp(a)
        if next_norm is None:
            return None, h + x
        return next_norm.add_forward(h, x)


class LlamaForCausalLM(CausalLM):
    """Llama/Mistral decoder layers in the shared causal-LM shell (Qwen2 sets qkv_bias)."""

    qkv_bias = False

    def __init__(self, config: ModelConfig) -> None:
        qkv_bias = self.qkv_bias or config.attention_bias
        super().__init__(
            config, (LlamaDecoderLayer(config, qkv_bias) for _ in range(config.num_hidden_layers))
        )

    def merge_projections(self) -> None:
        """One GEMM for q/k/v and one for gate/up in every layer (before the weights load: they load into
        the merged tensors through the linears, which become views of them)."""
        for layer in self.model.layers:
            layer.self_attn.merge_projections()
            layer.mlp.merge_projections()

    def fuse_gemv(self, rows: int, projections: frozenset[str] = FUSED_GEMV) -> None:
        """Steps of at most `rows` tokens fuse o_proj and / or down_proj with the norms after them (0: never)."""
        assert projections <= FUSED_GEMV, f"fusable projections: {sorted(FUSED_GEMV)}, got {sorted(projections)}"
        for layer in self.model.layers:
            layer.fused_gemv_rows, layer.fused_gemv = rows, projections

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]
