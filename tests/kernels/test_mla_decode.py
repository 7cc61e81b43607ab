"""MLA absorbed decode kernel against its fp32 reference, and absorption against unabsorbed attention.

Bounds: kernel vs reference (fp32, interpreter) 1e-5 relative; absorbed vs unabsorbed DeepSeek
attention in float64 1e-10 (absorption is exact algebra, only rounding differs).
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.mla_decode import reference as ref
from kvpilot.engine.kernels.mla_decode.kernel import mla_decode_triton

pytestmark = pytest.mark.kernels

PAGE = 16


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def paged_latent(lens: list[int], rank: int, rope: int, gen: torch.Generator, dtype=torch.float32):
    num_blocks = sum(-(-n // PAGE) for n in lens) + 2
    cache = torch.randn(num_blocks, PAGE, rank + rope, generator=gen, dtype=dtype)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.full((len(lens), max(-(-n // PAGE) for n in lens)), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        count = -(-n // PAGE)
        tables[b, :count] = perm[used : used + count]
        used += count
    return cache, tables


@pytest.mark.parametrize(("lens", "splits"), [([1, 15, 16], 1), ([17, 63, 300], 4)])
@pytest.mark.parametrize("heads", [5, 16])
def test_kernel_matches_reference(lens: list[int], splits: int, heads: int) -> None:
    gen = torch.Generator().manual_seed(heads)
    rank, rope = 48, 16
    cache, tables = paged_latent(lens, rank, rope, gen)
    q_lat = torch.randn(len(lens), heads, rank, generator=gen)
    q_pe = torch.randn(len(lens), heads, rope, generator=gen)
    context = torch.tensor(lens, dtype=torch.int32)
    got = mla_decode_triton(q_lat, q_pe, cache, tables, context, 0.1, num_splits=splits)
    want = ref.mla_decode_reference(q_lat, q_pe, cache, tables, context, 0.1)
    assert got.shape == (len(lens), heads, rank)
    assert rel_err(got, want) < 1e-5


def test_absorbed_equals_unabsorbed_deepseek_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    heads, nope, rope, v_dim, rank, lens = 4, 24, 8, 20, 32, [7, 33]
    kv_b = torch.randn(heads * (nope + v_dim), rank, generator=gen, dtype=torch.float64) / rank**0.5
    w_uk, w_uv = ref.split_kv_b_proj(kv_b, heads, nope, v_dim)
    cache, tables = paged_latent(lens, rank, rope, gen, dtype=torch.float64)
    q_nope = torch.randn(len(lens), heads, nope, generator=gen, dtype=torch.float64)
    q_pe = torch.randn(len(lens), heads, rope, generator=gen, dtype=torch.float64)
    scale = (nope + rope) ** -0.5
    context = torch.tensor(lens, dtype=torch.int32)
    q_lat = ref.absorb_query(q_nope, w_uk).double()
    absorbed = ref.project_output(
        ref.mla_decode_reference(q_lat.double(), q_pe, cache, tables, context, scale).double(), w_uv
    )
    for b, n in enumerate(lens):
        rows = ref.gather_latent(cache, tables[b], n)
        want = ref.mla_attention_unabsorbed(
            q_nope[b].double(), q_pe[b], rows[:, :rank], rows[:, rank:], w_uk.double(), w_uv.double(), scale
        )
        # reference math runs in fp32; absorption itself adds no error beyond that rounding
        assert rel_err(absorbed[b], want) < 1e-5


def test_absorption_is_exact_in_float64() -> None:
    gen = torch.Generator().manual_seed(1)
    heads, nope, rank, n = 3, 16, 24, 11
    w_uk = torch.randn(heads, nope, rank, generator=gen, dtype=torch.float64)
    q_nope = torch.randn(heads, nope, generator=gen, dtype=torch.float64)
    c_kv = torch.randn(n, rank, generator=gen, dtype=torch.float64)
    k_nope = torch.einsum("tl,hdl->thd", c_kv, w_uk)
    absorbed = torch.einsum("hd,hdl->hl", q_nope, w_uk) @ c_kv.T
    direct = torch.einsum("hd,thd->ht", q_nope, k_nope)
    assert rel_err(absorbed, direct) < 1e-12


def test_kernel_then_w_uv_matches_unabsorbed() -> None:
    gen = torch.Generator().manual_seed(2)
    heads, nope, rope, v_dim, rank, lens = 16, 16, 16, 16, 64, [40]
    kv_b = torch.randn(heads * (nope + v_dim), rank, generator=gen) / rank**0.5
    w_uk, w_uv = ref.split_kv_b_proj(kv_b, heads, nope, v_dim)
    cache, tables = paged_latent(lens, rank, rope, gen)
    q_nope = torch.randn(1, heads, nope, generator=gen)
    q_pe = torch.randn(1, heads, rope, generator=gen)
    scale = (nope + rope) ** -0.5
    context = torch.tensor(lens, dtype=torch.int32)
    latent = mla_decode_triton(ref.absorb_query(q_nope, w_uk), q_pe, cache, tables, context, scale)
    got = ref.project_output(latent, w_uv)[0]
    rows = ref.gather_latent(cache, tables[0], lens[0])
    want = ref.mla_attention_unabsorbed(q_nope[0], q_pe[0], rows[:, :rank], rows[:, rank:], w_uk, w_uv, scale)
    assert rel_err(got, want) < 1e-5


def test_split_kv_b_proj_rejects_wrong_rows() -> None:
    with pytest.raises(ValueError, match="expected H"):
        ref.split_kv_b_proj(torch.zeros(10, 4), 2, 3, 3)


def test_store_latent_matches_reference() -> None:
    from kvpilot.engine.kernels.mla_decode.store import store_latent_reference, store_latent_triton

    gen = torch.Generator().manual_seed(5)
    c_kv, k_pe = torch.randn(6, 48, generator=gen), torch.randn(6, 16, generator=gen)
    slots = torch.tensor([3, -1, 17, 0, -1, 40], dtype=torch.int32)
    got, want = torch.zeros(3, PAGE, 64), torch.zeros(3, PAGE, 64)
    store_latent_triton(c_kv, k_pe, got, slots)
    store_latent_reference(c_kv, k_pe, want, slots)
    assert torch.equal(got, want)
    assert torch.equal(got.view(-1, 64)[17], torch.cat([c_kv[2], k_pe[2]]))
    assert int((got.view(-1, 64).abs().sum(1) > 0).sum()) == 4


def test_store_latent_rows_without_rope_part() -> None:
    """The MLA conversion stores its latent alone (R = 0): same rows, padding (-1) skipped."""
    from kvpilot.engine.kernels.mla_decode.store import store_latent_reference, store_latent_triton

    gen = torch.Generator().manual_seed(6)
    latent = torch.randn(5, 24, generator=gen)
    slots = torch.tensor([9, -1, 2, 30, -1], dtype=torch.int32)
    got, want = torch.zeros(3, PAGE, 24), torch.zeros(3, PAGE, 24)
    store_latent_triton(latent, latent[:, 24:], got, slots)
    store_latent_reference(latent, latent[:, 24:], want, slots)
    assert torch.equal(got, want) and torch.equal(got.view(-1, 24)[30], latent[3])
    assert int((got.view(-1, 24).abs().sum(1) > 0).sum()) == 3


def test_ops_dispatch_between_triton_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpilot.engine.kernels.mla_decode import ops

    gen = torch.Generator().manual_seed(6)
    c_kv, k_pe = torch.randn(20, 32, generator=gen), torch.randn(20, 16, generator=gen)
    q_lat, q_pe = torch.randn(1, 4, 32, generator=gen), torch.randn(1, 4, 16, generator=gen)
    tables = torch.tensor([[1, 0]], dtype=torch.int32)
    slots = torch.cat([16 + torch.arange(16), torch.arange(4)]).to(torch.int32)
    outs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("KVPILOT_KERNELS", backend)
        cache = torch.zeros(2, PAGE, 48)
        ops.store_latent(c_kv, k_pe, cache, slots)
        outs[backend] = ops.mla_decode(q_lat, q_pe, cache, tables, torch.tensor([20], dtype=torch.int32), 0.2)
    assert rel_err(outs["triton"], outs["torch"]) < 1e-5
