"""The public ops: backend selection, and store -> prefill -> decode through the Triton path."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine import kernels
from kvpilot.engine.kernels.dispatch import backend_for
from kvpilot.engine.kernels.paged_decode.reference import paged_attention_decode_reference
from kvpilot.engine.kernels.paged_prefill.reference import paged_attention_prefill_reference
from tests.kernels.paged_cases import DEVICE, REL_TOL, cu_seqlens, make_paged_case, relative_error, slots_for

pytestmark = pytest.mark.kernels


def test_backend_default_follows_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPILOT_KERNELS", raising=False)
    assert backend_for(torch.zeros(1)) == "torch"
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    assert backend_for(torch.zeros(1)) == "triton"
    monkeypatch.setenv("KVPILOT_KERNELS", "torch")
    assert backend_for(torch.zeros(1)) == "torch"


def test_backend_rejects_unknown_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPILOT_KERNELS", "cuda")
    with pytest.raises(ValueError, match="triton"):
        backend_for(torch.zeros(1))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_chunked_prefill_then_decode(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """Two sequences prefilled in two chunks, then one decode step, all through the public ops."""
    monkeypatch.setenv("KVPILOT_KERNELS", backend)
    num_heads, num_kv_heads, head_dim, block_size = 4, 2, 64, 16
    final_lens = [37, 21]
    case = make_paged_case(final_lens, num_kv_heads, head_dim, block_size, torch.float32)
    case.k_cache.zero_()
    case.v_cache.zero_()
    gen = torch.Generator().manual_seed(3)
    keys = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(DEVICE) for n in final_lens]
    values = [torch.randn(n, num_kv_heads, head_dim, generator=gen).to(DEVICE) for n in final_lens]
    queries = [torch.randn(n, num_heads, head_dim, generator=gen).to(DEVICE) for n in final_lens]
    scale = head_dim**-0.5
    for lo, hi in [(0, 20), (20, None)]:
        chunks = [range(lo, min(hi or n - 1, n - 1)) for n in final_lens]
        slots = slots_for(case, [list(c) for c in chunks])
        key = torch.cat([k[c.start : c.stop] for k, c in zip(keys, chunks, strict=True)])
        value = torch.cat([v[c.start : c.stop] for v, c in zip(values, chunks, strict=True)])
        kernels.store_kvcache(key, value, case.k_cache, case.v_cache, slots)
        q = torch.cat([qs[c.start : c.stop] for qs, c in zip(queries, chunks, strict=True)])
        cu = cu_seqlens([len(c) for c in chunks], device=DEVICE)
        context = torch.tensor([c.stop for c in chunks], dtype=torch.int32, device=DEVICE)
        args = (q, case.k_cache, case.v_cache, case.block_tables, cu, context, scale)
        out = kernels.paged_attention_prefill(*args)
        assert relative_error(out, paged_attention_prefill_reference(*args)) < REL_TOL[torch.float32]
    last = [n - 1 for n in final_lens]
    key = torch.stack([k[p] for k, p in zip(keys, last, strict=True)])
    value = torch.stack([v[p] for v, p in zip(values, last, strict=True)])
    kernels.store_kvcache(key, value, case.k_cache, case.v_cache, slots_for(case, [[p] for p in last]))
    q = torch.stack([qs[p] for qs, p in zip(queries, last, strict=True)])
    out = kernels.paged_attention_decode(q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, scale)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q[:1, :, None].float(), keys[0][None].transpose(1, 2), values[0][None].transpose(1, 2), scale=scale,
        enable_gqa=True,
    )
    assert relative_error(out[0], dense[0, :, 0]) < REL_TOL[torch.float32]
    ref = paged_attention_decode_reference(q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, scale)
    assert relative_error(out, ref) < REL_TOL[torch.float32]
