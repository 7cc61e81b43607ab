"""Lightning attention (MiniMax-Text-01 linear attention with a per-head exponential decay).

Per head with decay lambda = exp(-slope): S_t = lambda * S_{t-1} + k_t^T v_t, o_t = q_t S_t, with
the recurrent state ("summary") S [Dk, Dv] in fp32 in a state pool [num_slots, H, Dk, Dv].
`lightning_attn.prefill.lightning_prefill_triton` (chunked, varlen, state in and out) and
`lightning_attn.decode.lightning_decode_triton` (one token per sequence); references in
`lightning_attn.reference`. No softmax, no scale, no normalisation inside: the caller applies
silu before and RMSNorm, the sigmoid output gate and out_proj after (see docs/strategies.md).
"""
