"""Launcher for the fused MoE MLP: checks the contract, sorts assignments by expert, runs both GEMMs.

The grid is sized for the worst routing of this step's shape (align.max_blocks), never for the
routing itself, so nothing waits for the device and a CUDA graph replays it for any routing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.fused_moe.align import align_by_expert
from kvpilot.engine.kernels.fused_moe.kernel import _moe_down_kernel, _moe_gate_up_kernel
from kvpilot.engine.kernels.paged_checks import dot_dtype, dot_precision


@dataclass(frozen=True)
class MoeConfig:
    """Tile sizes and launch options of both GEMMs (BLOCK_M also pads each expert's run)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def default_config(num_assignments: int, num_experts: int) -> MoeConfig:
    """Tiles by rows per expert: 16-row blocks for decode (a few tokens per expert), larger for prefill."""
    per_expert = num_assignments / num_experts
    if per_expert <= 16:
        return MoeConfig(16, 64, 128)
    if per_expert <= 48:  # 80 KB of shared memory over 4 stages: two programs per SM keep loads in flight
        return MoeConfig(32, 64, 64, num_stages=4)
    if per_expert <= 128:
        return MoeConfig(64, 128, 64)
    return MoeConfig(128, 128, 64, num_warps=8)


def fused_moe_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: MoeConfig | None = None,
) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], both contiguous in x's dtype;
    topk_weights [T, k] (fp32), topk_ids [T, k] -> sum_k weights * expert(x) [T, H]."""
    check_triton_device(x, w13, w2, topk_weights, topk_ids)
    assert x.dim() == 2 and x.stride(1) == 1, f"x must be [T, H] with contiguous rows, got {tuple(x.shape)}"
    tokens, hidden = x.shape
    experts, two_inter = w13.shape[0], w13.shape[1]
    inter = two_inter // 2
    assert w13.shape == (experts, 2 * inter, hidden) and w13.is_contiguous(), f"w13 {tuple(w13.shape)}"
    assert w2.shape == (experts, hidden, inter) and w2.is_contiguous(), f"w2 {tuple(w2.shape)}"
    assert w13.dtype == w2.dtype == x.dtype, f"dtypes x {x.dtype}, w13 {w13.dtype}, w2 {w2.dtype}"
    assert topk_ids.dim() == 2 and topk_ids.shape[0] == tokens and topk_weights.shape == topk_ids.shape
    top_k = topk_ids.shape[1]
    n = tokens * top_k
    if n == 0:
        return torch.zeros_like(x)
    cfg = config or default_config(n, experts)
    blocks = align_by_expert(topk_ids, experts, cfg.block_m)
    grid_m = blocks.block_experts.numel()
    operand = dot_dtype(x.dtype)  # bf16 (fp32 under the interpreter, whose bf16 dot is wrong)
    precision = dot_precision(operand)
    h = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    _moe_gate_up_kernel[(grid_m, triton.cdiv(inter, cfg.block_n))](
        x, w13, h, blocks.sorted_ids, blocks.block_experts, blocks.num_padded,
        n, inter, hidden, x.stride(0), w13.stride(0), w13.stride(1), h.stride(0),
        TOP_K=top_k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT_DTYPE=operand, DOT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    out = torch.empty(n, hidden, dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    _moe_down_kernel[(grid_m, triton.cdiv(hidden, cfg.block_n))](
        h, w2, out, weights, blocks.sorted_ids, blocks.block_experts, blocks.num_padded,
        n, hidden, inter, h.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT_DTYPE=operand, DOT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out.view(tokens, top_k, hidden).sum(dim=1) if top_k > 1 else out
