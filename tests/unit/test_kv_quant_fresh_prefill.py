"""An 8-bit cache's prefill of chunks with no cached context attends over the step's own 16-bit K/V.

fresh_layout places every token of the packed chunks in a compact buffer of paged blocks; the attention over
it equals the 16-bit paged prefill over a real cache holding the same K/V (scattered blocks, other chunks'
blocks interleaved), on the torch reference and on the Triton kernels under the interpreter.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels import paged_attention_prefill, store_kvcache
from kvpilot.engine.strategies.kv_quant.fresh_prefill import fresh_layout, fresh_prefill_attention

pytestmark = pytest.mark.unit

LENS = [5, 17, 1, 8, 30]
BLOCK = 8


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def test_every_token_gets_its_own_row_in_its_chunks_blocks() -> None:
    width = 6
    layout = fresh_layout(_cu(LENS), sum(LENS), width, BLOCK)
    slots = layout.slots.tolist()
    assert len(set(slots)) == len(slots) and max(slots) < layout.num_blocks * BLOCK
    row = 0
    for b, n in enumerate(LENS):
        for offset in range(n):  # the kernel's lookup: table[b, offset // bs] * bs + offset % bs
            assert slots[row] == int(layout.tables[b, offset // BLOCK]) * BLOCK + offset % BLOCK
            row += 1
        used = -(-n // BLOCK)
        assert (layout.tables[b, used:] == -1).all() and (layout.tables[b, :used] >= 0).all()
    assert layout.num_blocks >= sum(-(-n // BLOCK) for n in LENS)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.kernels)])
def test_attention_over_the_buffer_equals_a_16bit_paged_cache(backend: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KVPILOT_KERNELS", backend)
    if backend == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    hq, hkv, d, total = 4, 2, 32, sum(LENS)
    q, k, v = torch.randn(total, hq, d), torch.randn(total, hkv, d), torch.randn(total, hkv, d)
    cu, lens = _cu(LENS), torch.tensor(LENS, dtype=torch.int32)
    width = 4
    # the real cache: each chunk's blocks scattered over a shuffled pool
    pool = torch.randperm(64).to(torch.int32)
    tables = torch.full((len(LENS), width), -1, dtype=torch.int32)
    slots, used = [], 0
    for b, n in enumerate(LENS):
        blocks = -(-n // BLOCK)
        tables[b, :blocks] = pool[used : used + blocks]
        used += blocks
        slots += [int(tables[b, i // BLOCK]) * BLOCK + i % BLOCK for i in range(n)]
    k_cache, v_cache = torch.zeros(64, BLOCK, hkv, d), torch.zeros(64, BLOCK, hkv, d)
    store_kvcache(k, v, k_cache, v_cache, torch.tensor(slots, dtype=torch.int32))
    want = paged_attention_prefill(q, k_cache, v_cache, tables, cu, lens, 0.2)
    layout = fresh_layout(cu, total, width, BLOCK)
    for bound in (None, max(LENS)):
        got = fresh_prefill_attention(q, k, v, layout, cu, lens, BLOCK, 0.2, bound)
        torch.testing.assert_close(got, want, rtol=0, atol=2e-3 if backend == "triton" else 1e-6)
