"""What the latent decode kernels share (kernels/mla_decode: absorbed; kernels/mla_conversion: keys
decompressed in the program): the online-softmax step over a tile of scores with the value side in
latent space, the split-K epilogue (a normalised output, or a split's partial output and log2-sum-exp for
kv_quant/split_reduce), and on the host the split count and the partials' scratch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.interpreter_compat import patch_interpreter

patch_interpreter()


@triton.jit
def online_softmax_step(s, mask_n, qk_scale_log2, c, m_i, l_i, acc):
    """Scores s [ROWS, BLOCK_N] of a tile of latent rows c [BLOCK_N, L] (mask_n: rows within the context)
    -> the running max, sum and acc += p c, rescaled by exp2 (scores scaled to log2 units)."""
    s = tl.where(mask_n[None, :], s * qk_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
    return m_new, l_i, acc


@triton.jit
def store_output(out_ptr, part_o_ptr, part_lse_ptr, b, heads, split, offs_l, mask_h, mask_l, acc, l_i, m_i,
                 stride_ob, stride_oh, stride_wb, stride_wh, stride_ws, stride_lb, stride_lh,
                 NUM_SPLITS: tl.constexpr):  # fmt: skip
    """The program's rows of the latent output [B, H, L], or with several splits its partial output and
    log2-sum-exp (kv_quant/split_reduce combines them)."""
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    mask_out = mask_h[:, None] & mask_l[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_l[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask_out)
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(part_o_ptr + b * stride_wb + heads[:, None] * stride_wh + split * stride_ws + offs_l[None, :],
                 out, mask=mask_out)
        tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


def num_splits_for(num_programs: int, device: torch.device, per_sm: int) -> int:
    """About `per_sm` programs per SM, rounded down to a power of two, at most 16 (1 off CUDA)."""
    if device.type != "cuda":
        return 1
    target = per_sm * torch.cuda.get_device_properties(device).multi_processor_count // max(1, num_programs)
    return max(1, min(16, 1 << (max(1, target).bit_length() - 1)))


def split_scratch(out: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs [B, H, S, L] and log2-sum-exps [B, H, S] for out [B, H, L]; with one split the
    kernel writes `out` itself and these are placeholders (out, out)."""
    if num_splits == 1:
        return out, out
    batch, heads, width = out.shape
    part_o = torch.empty(batch, heads, num_splits, width, dtype=torch.float32, device=out.device)
    return part_o, torch.empty(batch, heads, num_splits, dtype=torch.float32, device=out.device)
