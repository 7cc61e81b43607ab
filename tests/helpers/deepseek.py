"""Tiny random DeepSeek-V2/V3 checkpoints built with HF transformers (MLA + MoE), for parity tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpilot.engine.make_model import write_generation_config, write_tokenizer

TINY_DEEPSEEK: dict[str, Any] = {
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "tie_word_embeddings": False,
}


def build_deepseek_checkpoint(out_dir: Path, version: int = 2, seed: int = 0, **overrides: Any) -> Path:
    """save_pretrained of a random DeepseekV{2,3}ForCausalLM; norms, router and expert biases perturbed.

    HF initialises weights with std 0.02, which makes every logit nearly equal (greedy ties); the
    weights are redrawn with std 1/sqrt(fan_in) so continuations are well separated.
    """
    import torch
    import transformers

    fields = {**TINY_DEEPSEEK, **overrides}
    if version == 3:
        fields.setdefault("n_group", 2)
        fields.setdefault("topk_group", 1)
        config = transformers.DeepseekV3Config(**fields)
        cls = transformers.DeepseekV3ForCausalLM
    else:
        config = transformers.DeepseekV2Config(**fields)
        cls = transformers.DeepseekV2ForCausalLM
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            elif param.dim() >= 2 and "embed_tokens" not in name:
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[-1] ** 0.5)
            elif "embed_tokens" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=gen))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    write_tokenizer(out_dir, config.vocab_size)
    write_generation_config(out_dir)
    return out_dir
