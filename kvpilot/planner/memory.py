"""Estimates of the non-KV memory: weights from the config's shapes, activations of one prefill step."""

from __future__ import annotations

from kvpilot.planner.model_shape import FULL, ModelShape

LOGITS_BYTES = 4  # logits are sampled in fp32


def parameter_count(model: ModelShape) -> int:
    """Parameters from the config's shapes (embeddings, attention, MLP or experts, norms)."""
    embed = model.vocab_size * model.hidden_size
    head = 0 if model.tie_word_embeddings else embed
    layers = 0
    for index, kind in enumerate(model.kinds):
        attention = _attention_params(model) if kind == FULL else _linear_params(model)
        layers += attention + _mlp_params(model, index) + 2 * model.hidden_size
    return embed + head + layers + model.hidden_size


def weights_bytes(model: ModelShape) -> int:
    """Bytes of the weights at the checkpoint's stored dtype."""
    return parameter_count(model) * (model.weight_dtype_bytes or model.dtype_bytes)


def activation_peak_bytes(model: ModelShape, num_batched_tokens: int, max_num_seqs: int) -> int:
    """Peak transient bytes of one forward pass over `num_batched_tokens` (one layer lives at a time).

    Per token: the residual and normed hidden states, Q/K/V and the attention output, the MLP's
    gate, up and activated tensors; plus fp32 logits for the last token of each sequence.
    """
    hd = model.head_dim
    qkv_o = (2 * model.num_attention_heads + 2 * model.num_kv_heads) * hd
    per_token = 2 * model.hidden_size + qkv_o + 3 * _active_intermediate(model)
    logits = min(max_num_seqs, num_batched_tokens) * model.vocab_size * LOGITS_BYTES
    return num_batched_tokens * per_token * model.dtype_bytes + logits


def _attention_params(model: ModelShape) -> int:
    h, hd = model.hidden_size, model.head_dim
    if model.mla:
        m = model.mla
        q_out = model.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        q = h * m.q_lora_rank + m.q_lora_rank * q_out if m.q_lora_rank else h * q_out
        kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_b = m.kv_lora_rank * model.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv_a + kv_b + model.num_attention_heads * m.v_head_dim * h
    q = h * model.num_attention_heads * hd
    kv = 2 * h * model.num_kv_heads * hd
    return q + kv + model.num_attention_heads * hd * h


def _linear_params(model: ModelShape) -> int:
    inner = model.num_attention_heads * model.head_dim
    return 4 * model.hidden_size * inner + inner * model.hidden_size  # q, k, v, gate, out


def _mlp_params(model: ModelShape, layer: int) -> int:
    moe = model.moe
    if moe is None or layer < moe.dense_layers:
        return 3 * model.hidden_size * model.intermediate_size
    experts = (moe.num_experts + moe.num_shared_experts) * 3 * model.hidden_size * moe.expert_intermediate_size
    return experts + model.hidden_size * moe.num_experts  # + router


def _active_intermediate(model: ModelShape) -> int:
    moe = model.moe
    if moe is None:
        return model.intermediate_size
    routed = (moe.experts_per_token + moe.num_shared_experts) * moe.expert_intermediate_size
    return max(routed, model.intermediate_size if moe.dense_layers else 0)
