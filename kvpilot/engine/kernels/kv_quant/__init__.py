"""8-bit KV caches: int8 (per token and head scales) and fp8 e4m3 (per head scales), dequantised in-kernel.

Layout: `k_cache`/`v_cache` `[num_blocks, block_size, num_kv_heads, head_dim]` of int8 or
`torch.float8_e4m3fn`. int8 carries scale caches `[num_blocks, block_size, num_kv_heads]` (fp32 or
fp16) written by the store; fp8 carries one fp32 scale per KV head `[num_kv_heads]`, fixed per layer
(see `calibrate_fp8_scale`). Import the launchers from their modules:
`kv_quant.store` (quantising store), `kv_quant.decode` (paged GQA decode),
`kv_quant.prefill` (dequantise the batch's blocks, then the base paged prefill).
"""
