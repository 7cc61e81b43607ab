"""HF config.json dicts of real model families, shared by the planner, operator and cluster tests."""

from __future__ import annotations

LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 129280, "torch_dtype": "bfloat16",
}
# as published: fp8 weights in 128x128 blocks (the planner counts their scales)
DEEPSEEK_V3_FP8 = {
    **DEEPSEEK_V3, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}
