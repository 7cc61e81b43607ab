"""Launcher for the fused small-batch linear + add + RMSNorm: checks the contract, sizes the grid."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.gemv_norm import MAX_ROWS
from kvpilot.engine.kernels.gemv_norm.kernel import _gemv_norm_kernel
from kvpilot.engine.kernels.tickets import ticket_counters


@dataclass(frozen=True)
class GemvConfig:
    """How one call is launched: weight rows per program, K per loop step, K splits."""

    block_n: int = 16
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    split_epilogue: bool = False  # the two-level epilogue (kernel.py; SPLIT_EPILOGUE below picks the default)


SPLIT_EPILOGUE = False  # gemv_config's choice; unmeasured (bench/device_issue30.sh gemv_epilogue decides)


def gemv_config(n: int, k: int, device: torch.device) -> GemvConfig:
    """512 of K per loop step and K in two splits, with 16 weight rows a program, 32 once K reaches 8192
    (fewer, longer programs over the long rows). Measured on an H100 at Llama-3-8B's shapes and M = 1
    (bench/gemv_norm_sweep.py, the best of its 33 launch configs): o_proj [4096 x 4096] 17.2 us against
    cuBLAS + add-RMSNorm's 20.4 (bound 11.5), down_proj [4096 x 14336] 47.1 against 48.5 (bound 40.3);
    the earlier rule (16 x 256, no split at N = 4096) took 35.7 and 116.6. Small K keeps one split."""
    block_k = min(512, triton.next_power_of_2(max(k, 16)))
    split = 2 if k >= 2048 else 1
    return GemvConfig(block_n=32 if k >= 8192 else 16, block_k=block_k, split_k=split, split_epilogue=SPLIT_EPILOGUE)


def counters(device: torch.device, rows: int, slots: int | None = None) -> torch.Tensor:
    """One ticket counter per row (kernels/tickets.py); `slots` of them when more are needed."""
    if rows > MAX_ROWS:
        raise ValueError(f"the fused GEMV takes at most {MAX_ROWS} rows, got {rows}")
    found = ticket_counters(device, slots or rows)
    if found is None:
        raise RuntimeError("the fused GEMV's counters are allocated by a first call outside CUDA graph capture")
    return found


def linear_add_rmsnorm_triton(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
    silu_input: bool = False, config: GemvConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """x [M, K] (silu_input: [M, 2K] = [gate | up]), weight [N, K], residual [M, N], norm_weight [N]
    -> (norm_weight * rmsnorm(y + residual), y + residual), y = x @ weight.T; M <= MAX_ROWS."""
    check_triton_device(x, weight, residual, norm_weight)
    assert x.dim() == 2 and weight.dim() == 2 and x.stride(1) == 1 and weight.stride(1) == 1, "rows must be contiguous"
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    assert x.shape[1] == (2 * k if silu_input else k), f"x {tuple(x.shape)} / weight {tuple(weight.shape)}"
    assert residual.shape == (m, n) and residual.stride(1) == 1, f"residual {tuple(residual.shape)}: want ({m}, {n})"
    assert norm_weight.shape == (n,) and norm_weight.is_contiguous()
    assert len({x.dtype, weight.dtype, residual.dtype, norm_weight.dtype}) == 1, "one dtype"
    out, total = torch.empty_like(residual), torch.empty_like(residual)
    if m == 0:
        return out, total
    cfg = config or gemv_config(n, k, x.device)
    assert cfg.block_n & (cfg.block_n - 1) == 0 and cfg.block_k & (cfg.block_k - 1) == 0, "power-of-two blocks"
    partial = torch.empty((m, cfg.split_k, n), dtype=torch.float32, device=x.device)
    blocks = triton.cdiv(n, cfg.block_n)
    grid = (blocks, cfg.split_k, m)
    # the row counters; with the split epilogue one more per (row, block), and a sum of squares per (row, block)
    tickets = counters(x.device, m, m * (blocks + 1) if cfg.split_epilogue else m)
    split = {}
    if cfg.split_epilogue:
        split = dict(SPLIT_EPILOGUE=True, BLOCK_BLOCKS=triton.next_power_of_2(blocks), block_counter_ptr=tickets[m:],
                     block_sq_ptr=torch.empty((m, blocks), dtype=torch.float32, device=x.device))  # fmt: skip
    _gemv_norm_kernel[grid](
        x, weight, residual, norm_weight, out, total, partial, tickets, eps, n, k,
        x.stride(0), weight.stride(0), residual.stride(0), out.stride(0), total.stride(0),
        SILU_INPUT=silu_input, SPLIT_K=cfg.split_k, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        BLOCK_ROW=triton.next_power_of_2(n), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **split,
    )
    return out, total
