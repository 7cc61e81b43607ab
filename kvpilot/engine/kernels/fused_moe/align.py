"""Token-expert assignments sorted by expert, each expert's run padded to whole blocks of BLOCK_M rows.

All on the device with sizes fixed by (tokens, top_k, experts, BLOCK_M): no host sync, so a CUDA
graph can hold it. Assignment i is (token i // top_k, slot i % top_k). Expert e's assignments take
rows [start_e, start_e + count_e) of `sorted_ids` (in assignment order), its run rounded up to a
multiple of BLOCK_M; the pad rows hold `num_assignments` (the kernels mask them). Block b of BLOCK_M
rows belongs to `block_experts[b]`; rows and blocks at or past `num_padded[0]` are unused (never read;
this torch version fills them, the Triton one, align_kernel.py, leaves them unwritten).

`align_by_expert` takes the Triton kernel on CUDA (or under the interpreter) up to TRITON_ALIGN_MAX
assignments, a decode step's count: one launch instead of the ~25 torch ops below, which matter once
the MoE GEMMs stream only the experts a few tokens chose. Prefill steps keep the torch ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kvpilot.engine.kernels.dispatch import backend_for

TRITON_ALIGN_MAX = 8192  # assignments (tokens x top_k); the kernel re-reads them all per expert

def max_blocks(num_assignments: int, num_experts: int, block_m: int) -> int:
    """The most BLOCK_M blocks any routing of `num_assignments` over `num_experts` can fill."""
    used = min(num_experts, num_assignments)  # experts with at least one assignment
    return -(-(num_assignments + used * (block_m - 1)) // block_m)


@dataclass(frozen=True)
class ExpertBlocks:
    """Sorted assignment ids [max_blocks * BLOCK_M] int32, expert per block [max_blocks] int32,
    rows in use (padded) [1] int32."""

    sorted_ids: torch.Tensor
    block_experts: torch.Tensor
    num_padded: torch.Tensor
    block_m: int


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """Sort the assignments of topk_ids [T, k] by expert into BLOCK_M-row blocks (see the module doc)."""
    if topk_ids.numel() <= TRITON_ALIGN_MAX and backend_for(topk_ids) == "triton":
        return align_by_expert_triton(topk_ids, num_experts, block_m)
    return align_by_expert_torch(topk_ids, num_experts, block_m)


def align_by_expert_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    from kvpilot.engine.kernels.fused_moe.align_kernel import _align_kernel

    flat = topk_ids.reshape(-1)
    flat = flat if flat.is_contiguous() else flat.contiguous()
    n, device = flat.numel(), flat.device
    blocks = max_blocks(n, num_experts, block_m)
    sorted_ids = torch.empty(blocks * block_m, dtype=torch.int32, device=device)
    block_experts = torch.empty(blocks, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    block_e = triton.next_power_of_2(num_experts)
    chunk = max(16, min(triton.next_power_of_2(n), 8192 // block_e))
    _align_kernel[(num_experts,)](flat, sorted_ids, block_experts, num_padded, n,
                                  BLOCK_E=block_e, BLOCK_M=block_m, CHUNK=chunk)  # fmt: skip
    return ExpertBlocks(sorted_ids, block_experts, num_padded, block_m)


def align_by_expert_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """The same layout in torch ops (any size; pad rows and unused blocks filled)."""
    flat = topk_ids.reshape(-1).long()
    n, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    order = torch.sort(flat, stable=True).indices  # assignment ids grouped by expert, in order
    expert_of = flat[order]
    rank = torch.arange(n, device=device) - (counts.cumsum(0) - counts)[expert_of]
    dest = (padded_end - padded)[expert_of] + rank
    blocks = max_blocks(n, num_experts, block_m)
    sorted_ids = torch.full((blocks * block_m,), n, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(blocks, device=device) * block_m
    block_experts = torch.searchsorted(padded_end, starts, right=True).clamp_max_(num_experts - 1)
    return ExpertBlocks(sorted_ids, block_experts.to(torch.int32), padded_end[-1:].to(torch.int32), block_m)
