"""Named model shapes for benchmarks with random weights: a config.json and a tokenizer, no weights.

The engine loads them with `load_format="dummy"` (random weights drawn on the device), so an 8B
model's throughput can be measured without a 16 GB checkpoint. Shapes are the published configs'
dimensions; the tokenizer covers the whole vocabulary (make_model/full_vocab.py: every id decodes to
text that encodes back to it), so a generated token always reaches a stream as text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_COMMON = {"hidden_act": "silu", "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
           "torch_dtype": "bfloat16", "tie_word_embeddings": False, "initializer_range": 0.02}
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
        "attention_bias": False, "mlp_bias": False,
    },
    "qwen2-7b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "head_dim": 128, "vocab_size": 152064, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28, "rms_norm_eps": 1e-6,
    },
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
        "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
        "topk_method": "greedy", "norm_topk_prob": False, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
        "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "head_dim": 64, "vocab_size": 102400, "max_position_embeddings": 163840,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    },
    # MiniMax-Text-01's published layer dimensions with 8 of its 80 layers: one period of its 7:1
    # lightning:softmax pattern (456B parameters do not fit one GPU; 8 layers are ~48B, 96 GB in bf16);
    # max_position_embeddings 1M (published: 10.24M), rotary over the whole head as kvpilot runs it
    "minimax-text-01-8l": {
        "architectures": ["MiniMaxForCausalLM"], "model_type": "minimax", "hidden_size": 6144,
        "intermediate_size": 9216, "num_hidden_layers": 8, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 128, "num_local_experts": 32, "num_experts_per_tok": 2, "attn_type_list": [0] * 7 + [1],
        "vocab_size": 200064, "max_position_embeddings": 1048576, "rope_theta": 10000000.0, "rms_norm_eps": 1e-5,
        "linear_attn_alpha_factor": 3.5565588200778455, "full_attn_alpha_factor": 3.5565588200778455,
        "mlp_alpha_factor": 3.5565588200778455,
    },
}  # fmt: skip

def write_shape(name: str, out_dir: str | Path) -> Path:
    """Write `name`'s config.json, a tokenizer and generation_config.json into out_dir; return it."""
    from kvpilot.engine.make_model.tokenizer_files import write_generation_config, write_tokenizer

    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose one of {', '.join(SHAPES)}")
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    config = {**_COMMON, **SHAPES[name]}
    (root / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(root, config["vocab_size"], config["max_position_embeddings"], full_vocab=True)
    write_generation_config(root)
    return root
