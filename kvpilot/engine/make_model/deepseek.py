"""`kvpilot make-model --family deepseek_v2`: the MLA + MoE fields and random weights of a tiny DeepSeek-V2.

tiny: q_lora_rank 24 (queries through the low-rank path); small: no q_lora (as DeepSeek-V2-Lite).
Both: MoE with 4 routed experts, top-2 greedy softmax routing, 1 shared expert, first layer dense
(first_k_dense_replace=1). Names and shapes are HF's (loads in transformers' DeepseekV2ForCausalLM).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DEEPSEEK_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"kv_lora_rank": 32, "q_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
             "v_head_dim": 16, "moe_intermediate_size": 32},
    "small": {"kv_lora_rank": 64, "q_lora_rank": None, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
              "v_head_dim": 32, "moe_intermediate_size": 128},
}  # fmt: skip


def deepseek_fields(size: str, num_heads: int) -> dict[str, Any]:
    """config.json fields beyond the Llama ones (head_dim is the rope dim, as HF writes it)."""
    dims = DEEPSEEK_SIZES[size]
    return {
        **dims,
        "num_key_value_heads": num_heads,
        "head_dim": dims["qk_rope_head_dim"],
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "topk_method": "greedy",
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": False,
        "n_group": None,
        "topk_group": None,
        "attention_bias": False,
    }


def deepseek_layer_weights(
    config: dict[str, Any], layer: int, linear: Callable[[int, int], Any], norm: Callable[[int], Any]
) -> dict[str, Any]:
    """One decoder layer's attention and MLP tensors (without the two hidden-size layernorms)."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    rank, q_rank = config["kv_lora_rank"], config["q_lora_rank"]
    qk = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    p = f"model.layers.{layer}."
    w: dict[str, Any] = {}
    if q_rank is None:
        w[p + "self_attn.q_proj.weight"] = linear(heads * qk, hidden)
    else:
        w[p + "self_attn.q_a_proj.weight"] = linear(q_rank, hidden)
        w[p + "self_attn.q_a_layernorm.weight"] = norm(q_rank)
        w[p + "self_attn.q_b_proj.weight"] = linear(heads * qk, q_rank)
    w[p + "self_attn.kv_a_proj_with_mqa.weight"] = linear(rank + config["qk_rope_head_dim"], hidden)
    w[p + "self_attn.kv_a_layernorm.weight"] = norm(rank)
    w[p + "self_attn.kv_b_proj.weight"] = linear(
        heads * (config["qk_nope_head_dim"] + config["v_head_dim"]), rank
    )
    w[p + "self_attn.o_proj.weight"] = linear(hidden, heads * config["v_head_dim"])
    mlps = [("mlp.", config["intermediate_size"])]
    if layer >= config["first_k_dense_replace"]:
        inter = config["moe_intermediate_size"]
        w[p + "mlp.gate.weight"] = linear(config["n_routed_experts"], hidden)
        mlps = [(f"mlp.experts.{e}.", inter) for e in range(config["n_routed_experts"])]
        mlps.append(("mlp.shared_experts.", inter * config["n_shared_experts"]))
    for name, inter in mlps:
        w[p + name + "gate_proj.weight"] = linear(inter, hidden)
        w[p + name + "up_proj.weight"] = linear(inter, hidden)
        w[p + name + "down_proj.weight"] = linear(hidden, inter)
    return w
