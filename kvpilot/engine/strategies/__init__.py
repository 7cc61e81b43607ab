"""Memory strategies that change weights or approximate attention, in pure torch.

`gqa_conversion` (mean-pool KV heads), `mla_conversion` (shared K/V latent by SVD),
`performer` (positive random features + exact recent window + summary), `validation`
(runtime cosine check and fallback decision). The engine wires these in at load and decode.
"""
