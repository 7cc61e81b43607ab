"""store_kvcache: the Triton kernel writes exactly the rows the reference writes, and nothing else."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.store_kvcache.launcher import store_kvcache_triton
from kvpilot.engine.kernels.store_kvcache.reference import store_kvcache_reference
from tests.kernels.paged_cases import DEVICE, make_paged_case, slots_for

pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(1, 64, 16), (2, 128, 32), (3, 64, 8)])
def test_store_matches_reference(dtype: torch.dtype, num_kv_heads: int, head_dim: int, block_size: int) -> None:
    context_lens = [17, 1, 40]
    case = make_paged_case(context_lens, num_kv_heads, head_dim, block_size, dtype)
    positions = [list(range(n)) for n in context_lens]
    slots = slots_for(case, positions)
    slots[[3, 20]] = -1  # padding rows must not be written
    gen = torch.Generator().manual_seed(7)
    key = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    value = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
    store_kvcache_reference(key, value, k_ref, v_ref, slots)
    store_kvcache_triton(key, value, case.k_cache, case.v_cache, slots)
    assert torch.equal(case.k_cache, k_ref)
    assert torch.equal(case.v_cache, v_ref)
    flat_k = case.k_cache.view(-1, num_kv_heads, head_dim)
    assert torch.equal(flat_k[slots[0].long()], key[0])


def test_store_from_strided_fused_buffer() -> None:
    """key/value as views into a fused qkv buffer (token stride > Hkv*D) are read correctly."""
    num_heads, num_kv_heads, head_dim = 4, 2, 64
    case = make_paged_case([33], num_kv_heads, head_dim, 16, torch.float32)
    qkv = torch.randn(33, (num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE)
    key = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(33, num_kv_heads, head_dim)
    value = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(33, num_kv_heads, head_dim)
    slots = slots_for(case, [list(range(33))])
    k_ref, v_ref = case.k_cache.clone(), case.v_cache.clone()
    store_kvcache_reference(key, value, k_ref, v_ref, slots)
    store_kvcache_triton(key, value, case.k_cache, case.v_cache, slots)
    assert torch.equal(case.k_cache, k_ref) and torch.equal(case.v_cache, v_ref)


def test_store_rejects_dtype_mismatch() -> None:
    case = make_paged_case([4], 1, 64, 16, torch.float16)
    key = torch.randn(4, 1, 64, device=DEVICE)
    with pytest.raises(AssertionError, match="dtypes differ"):
        store_kvcache_triton(key, key, case.k_cache, case.v_cache, slots_for(case, [[0, 1, 2, 3]]))
