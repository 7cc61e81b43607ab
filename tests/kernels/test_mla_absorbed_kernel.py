"""The partial-RoPE MLA conversion's GPU decode: the native mla_decode Triton kernel fed a block-diagonal
rope query (strategies/mla/absorbed.py), under TRITON_INTERPRET on CPU, against the batched torch path.

Tiny shapes (the interpreter is slow): GQA groups, several sequences of uneven length over shuffled
blocks, one and several context splits. Bound: 1e-5 relative in fp32.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.strategies.mla.absorbed import latent_attention_torch, latent_attention_triton
from kvpilot.engine.strategies.mla.decode import DecodePlanner
from tests.unit.test_mla_absorbed_decode import PAGE, paged, rel_err

pytestmark = pytest.mark.kernels


@pytest.mark.parametrize(
    ("lens", "kv_heads", "group", "rope", "splits"), [([1, 19, 40], 2, 2, 4, 1), ([24, 7], 1, 3, 2, 2)]
)
def test_triton_path_matches_torch_path(lens, kv_heads, group, rope, splits) -> None:
    gen = torch.Generator().manual_seed(len(lens))
    rank, heads = 16, kv_heads * group
    cache, tables = paged(lens, rank + kv_heads * rope, gen)
    context = torch.tensor(lens, dtype=torch.int32)
    q_lat = torch.randn(len(lens), heads, rank, generator=gen)
    q_rope = torch.randn(len(lens), heads, rope, generator=gen)
    plan = DecodePlanner(torch.ones(4)).plan(tables, context, PAGE, torch.float32)
    want = latent_attention_torch(q_lat, q_rope, plan.gather(cache), plan, 0.3, kv_heads)
    got = latent_attention_triton(q_lat, q_rope, cache, tables, context, 0.3, kv_heads, splits)
    assert got.shape == want.shape == (len(lens), heads, rank)
    assert rel_err(got, want) < 1e-5
