"""Build paged KV caches with shuffled block tables for the kernel tests (CPU or CUDA)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# Under TRITON_INTERPRET=1 (tests/conftest.py sets it on machines without a GPU) the kernels run
# on CPU tensors; on a CUDA machine the same tests run the compiled kernels.
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@dataclass
class PagedCase:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# Relative-error bounds per dtype: fp32 math in both, so errors are input/output rounding only.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}


def make_paged_case(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    *,
    device: str = DEVICE,
    seed: int = 0,
    spare_blocks: int = 3,
    extra_table_width: int = 2,
) -> PagedCase:
    """Random K/V in blocks handed out in shuffled order; tables are -1 padded and wider than needed."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(needed) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen)
    width = max(needed, default=0) + extra_table_width
    block_tables = torch.full((len(context_lens), width), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(needed):
        block_tables[b, :n] = order[start : start + n].to(torch.int32)
        start += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    return PagedCase(
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=block_tables.to(device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
    )


def slots_for(case: PagedCase, positions: list[list[int]]) -> torch.Tensor:
    """Flat cache slots of the given logical positions of each sequence, concatenated."""
    block_size = case.k_cache.shape[1]
    tables = case.block_tables.cpu()
    slots = [int(tables[b, p // block_size]) * block_size + p % block_size for b, ps in enumerate(positions) for p in ps]
    return torch.tensor(slots, dtype=torch.int32, device=case.k_cache.device)


def cu_seqlens(q_lens: list[int], device: str = DEVICE) -> torch.Tensor:
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def strided_queries(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                    *, device: str = DEVICE, seed: int = 1) -> torch.Tensor:
    """q [T, Hq, D] as the q part of a fused qkv buffer: not contiguous over tokens, as the engine passes it."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype).to(device)
    return qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
