"""Lightning attention kernels against the naive fp32 recurrence, and the formulation against HF MiniMax.

Bounds (fp32, interpreter): kernel outputs and states within 1e-5 relative of the recurrence
(only summation order differs); the HF MiniMaxLightningAttention layer rebuilt around our kernels
(silu -> kernels -> RMSNorm -> sigmoid gate -> out_proj) within 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.lightning_attn import reference as ref
from kvpilot.engine.kernels.lightning_attn.decode import lightning_decode_triton
from kvpilot.engine.kernels.lightning_attn.prefill import lightning_prefill_triton

pytestmark = pytest.mark.kernels


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def packed(lens: list[int], heads: int, dim: int, gen: torch.Generator):
    total = sum(lens)
    q, k, v = (torch.randn(total, heads, dim, generator=gen) * 0.5 for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu


@pytest.mark.parametrize("lens", [[1, 15, 16, 17], [63, 300]])
def test_prefill_matches_recurrence(lens: list[int]) -> None:
    gen = torch.Generator().manual_seed(len(lens))
    heads, dim = 2, 32
    q, k, v, cu = packed(lens, heads, dim, gen)
    slopes = ref.minimax_slopes(heads, layer_idx=1, num_layers=4)
    pool = torch.randn(len(lens) + 2, heads, dim, dim, generator=gen) * 0.1
    want_pool = pool.clone()
    slots = torch.arange(len(lens), 0, -1, dtype=torch.int32)
    got = lightning_prefill_triton(q, k, v, cu, slopes, pool, slots, chunk=16, block_v=16)
    want = ref.lightning_prefill_reference(q, k, v, cu, slopes, want_pool, slots)
    assert rel_err(got, want) < 1e-5
    assert rel_err(pool, want_pool) < 1e-5
    assert torch.equal(pool[0], want_pool[0]), "an unused slot changed"


def test_prefill_skips_slot_minus_one_and_chunks_compose() -> None:
    gen = torch.Generator().manual_seed(3)
    heads, dim = 2, 16
    q, k, v, cu = packed([40], heads, dim, gen)
    slopes = ref.minimax_slopes(heads, layer_idx=0, num_layers=2)
    # one 40-token prefill == 23 tokens then 17 tokens from the saved state (chunked prefill)
    whole = torch.zeros(1, heads, dim, dim)
    out_whole = lightning_prefill_triton(q, k, v, cu, slopes, whole, torch.tensor([0], dtype=torch.int32), chunk=16)
    parts = torch.zeros(1, heads, dim, dim)
    slot = torch.tensor([0], dtype=torch.int32)
    first = lightning_prefill_triton(q[:23], k[:23], v[:23], torch.tensor([0, 23], dtype=torch.int32), slopes, parts, slot)
    second = lightning_prefill_triton(q[23:], k[23:], v[23:], torch.tensor([0, 17], dtype=torch.int32), slopes, parts, slot)
    assert rel_err(torch.cat([first, second]), out_whole) < 1e-5
    assert rel_err(parts, whole) < 1e-5
    skipped = torch.ones(1, heads, dim, dim)
    out = lightning_prefill_triton(q, k, v, cu, slopes, skipped, torch.tensor([-1], dtype=torch.int32))
    assert torch.equal(skipped, torch.ones_like(skipped)) and not out.any()


def test_decode_matches_recurrence() -> None:
    gen = torch.Generator().manual_seed(4)
    batch, heads, dim = 3, 4, 32
    q, k, v = (torch.randn(batch, heads, dim, generator=gen) for _ in range(3))
    slopes = ref.minimax_slopes(heads, layer_idx=2, num_layers=5)
    pool = torch.randn(5, heads, dim, dim, generator=gen)
    want_pool = pool.clone()
    slots = torch.tensor([4, -1, 1], dtype=torch.int32)
    got = lightning_decode_triton(q, k, v, slopes, pool, slots, block_v=16)
    want = ref.lightning_decode_reference(q, k, v, slopes, want_pool, slots)
    assert rel_err(got, want) < 1e-5 and rel_err(pool, want_pool) < 1e-5
    assert not got[1].any(), "slot -1 must leave its output row zero"
    for untouched in (0, 2, 3):
        assert torch.equal(pool[untouched], want_pool[untouched])


class _LinearCache:
    """Duck-typed stand-in for HF's cache: only the linear-attention state of one layer."""

    def __init__(self, layer_idx: int, state: torch.Tensor) -> None:
        self.layer_idx, self.state = layer_idx, state

    def get_linear_cache(self, layer_idx: int) -> torch.Tensor:
        return self.state

    def set_linear_cache(self, layer_idx: int, state: torch.Tensor) -> None:
        self.state = state


def test_formulation_matches_hf_minimax_layer() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    torch.manual_seed(0)
    heads, head_dim, layer_idx = 4, 16, 1
    config = transformers.MiniMaxConfig(
        hidden_size=64, num_attention_heads=heads, head_dim=head_dim, num_hidden_layers=4, block_size=16,
        num_key_value_heads=heads, intermediate_size=32, num_local_experts=2, vocab_size=50,
    )
    layer = MiniMaxLightningAttention(config, layer_idx).eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(1, 37, 64)
    slopes = ref.minimax_slopes(heads, layer_idx, config.num_hidden_layers)
    assert torch.equal(slopes, layer.slope_rate.flatten())

    def ours(hidden: torch.Tensor, pool: torch.Tensor, decode: bool) -> torch.Tensor:
        qkv = torch.nn.functional.silu(layer.qkv_proj(hidden[0])).view(hidden.shape[1], heads, 3 * head_dim)
        q, k, v = (t.contiguous() for t in qkv.split(head_dim, dim=-1))
        slot = torch.tensor([0], dtype=torch.int32)
        if decode:
            o = lightning_decode_triton(q, k, v, slopes, pool, slot, block_v=16)
        else:
            cu = torch.tensor([0, hidden.shape[1]], dtype=torch.int32)
            o = lightning_prefill_triton(q, k, v, cu, slopes, pool, slot, chunk=16, block_v=16)
        o = layer.norm(o.reshape(hidden.shape[1], heads * head_dim))
        return layer.out_proj(torch.sigmoid(layer.output_gate(hidden[0])) * o)

    with torch.no_grad():
        want, want_state = layer(x, None, None)
        pool = torch.zeros(1, heads, head_dim, head_dim)
        got = ours(x, pool, decode=False)
        assert rel_err(got, want[0]) < 1e-5 and rel_err(pool[0], want_state[0]) < 1e-5
        step = torch.randn(1, 1, 64)
        cache = _LinearCache(layer_idx, want_state)
        want_step, want_state2 = layer(step, None, None, past_key_values=cache)
        got_step = ours(step, pool, decode=True)
        assert rel_err(got_step, want_step[0]) < 1e-5 and rel_err(pool[0], want_state2[0]) < 1e-5


def test_launchers_reject_bad_state_pool() -> None:
    q = torch.randn(2, 2, 16)
    with pytest.raises(AssertionError, match="state_pool"):
        lightning_decode_triton(q, q, q, torch.ones(2), torch.zeros(3, 2, 16, 8), torch.zeros(2, dtype=torch.int32))


def test_ops_dispatch_between_triton_and_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpilot.engine.kernels.lightning_attn import ops

    gen = torch.Generator().manual_seed(8)
    q, k, v, cu = packed([5, 12], 2, 16, gen)
    slopes = ref.minimax_slopes(2, 0, 3)
    slots = torch.tensor([1, 0], dtype=torch.int32)
    outs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("KVPILOT_KERNELS", backend)
        pool = torch.zeros(2, 2, 16, 16)
        o = ops.lightning_prefill(q, k, v, cu, slopes, pool, slots)
        step = ops.lightning_decode(q[:2].contiguous(), k[:2].contiguous(), v[:2].contiguous(), slopes, pool, slots)
        outs[backend] = (o, step, pool)
    for got, want in zip(outs["triton"], outs["torch"], strict=True):
        assert rel_err(got, want) < 1e-5
