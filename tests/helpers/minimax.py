"""A tiny random HF MiniMax (hybrid lightning/softmax attention, sparse MoE) checkpoint for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpilot.engine.make_model import write_generation_config, write_tokenizer

# lightning, softmax, lightning, lightning: both kinds, a softmax layer between lightning ones
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]


def minimax_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "vocab_size": 384,
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": len(LAYER_TYPES),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 2048,
        "layer_types": LAYER_TYPES,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "block_size": 16,  # HF's lightning prefill block: prompts longer than 16 cross blocks
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "linear_attn_alpha_factor": 0.9,
        "linear_attn_beta_factor": 1.1,
        "full_attn_alpha_factor": 1.2,
        "full_attn_beta_factor": 0.8,
        "mlp_alpha_factor": 1.05,
        "mlp_beta_factor": 0.95,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "initializer_range": 0.1,
        "tie_word_embeddings": False,
    }
    config.update(overrides)
    return config


def build_minimax_checkpoint(out_dir: Path, seed: int = 0, **overrides: Any) -> Path:
    """HF MiniMaxForCausalLM with random weights (norms perturbed from ones), save_pretrained, fp32."""
    import torch
    import transformers

    config = transformers.MiniMaxConfig(**minimax_config(**overrides))
    config.architectures = ["MiniMaxForCausalLM"]
    torch.manual_seed(seed)
    model = transformers.MiniMaxForCausalLM(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=gen))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    write_tokenizer(out_dir, config.vocab_size)
    write_generation_config(out_dir)
    return out_dir
