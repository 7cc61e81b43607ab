"""Decode of the MLA conversion with RoPE on every dim (strategies/mla/attention.py) over its paged latent cache.

The cached row of token n is the SVD latent c_n; its key RoPE_n(W_UK,g c_n + b_K,g) rotates every dim,
so W_UK cannot be absorbed into the query. The kernel decompresses the keys a tile at a time inside
the program that scores them (never in memory), once per KV head for its whole query group, rotates
them at the cached positions, and keeps the value side absorbed: the output is sum_n p_n c_n in latent
space [B, H, r] (the caller applies W_UV and o_proj, strategies/mla/absorbed.project_values).
Launcher: `mla_conversion.kernel.mla_conversion_decode_triton`; the torch reference is
strategies/mla/decode.converted_mla_decode.
"""
