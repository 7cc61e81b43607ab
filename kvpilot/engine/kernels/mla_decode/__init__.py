"""MLA (DeepSeek-V2/V3) decode with weight absorption over a paged latent cache.

Cache `[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]`: per token the normalised latent
c_kv (after kv_a_layernorm) followed by the RoPE'd shared key k_pe. The caller absorbs W_UK into the
query (q_nope @ W_UK -> [B, H, kv_lora_rank]) and applies W_UV and o_proj to the latent output.
Launcher: `mla_decode.kernel.mla_decode_triton`; references in `mla_decode.reference`.
"""
