"""Triton RMSNorm over rows, with the residual add fused in front (one program per row)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_rmsnorm_row(x, res_row_ptr, w_ptr, out_row_ptr, sum_row_ptr, eps, N, cols, mask,
                    HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """One row: x (activation dtype, `cols` of it) + the residual row -> the sum row (when HAS_RESIDUAL)
    and weight * norm(sum) -> the out row; the numerics of rmsnorm/reference.py. Also the epilogue of
    gemv_norm's kernel."""
    if HAS_RESIDUAL:
        # round the sum to the activation dtype before the statistics, as the torch reference does
        x = (x.to(tl.float32) + tl.load(res_row_ptr + cols, mask=mask, other=0.0).to(tl.float32))
        x = x.to(sum_row_ptr.dtype.element_ty)
        tl.store(sum_row_ptr + cols, x, mask=mask)
    h = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / N + eps)
    normed = (h * rstd).to(out_row_ptr.dtype.element_ty).to(tl.float32)  # the reference rounds before the weight
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_row_ptr + cols, (w * normed).to(out_row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, eps, N, stride_x, stride_r, stride_o, stride_s,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    add_rmsnorm_row(x, res_ptr + row * stride_r, w_ptr, out_ptr + row * stride_o, sum_ptr + row * stride_s, eps, N,
                    cols, mask, HAS_RESIDUAL)  # fmt: skip
