"""The MLA conversion's fused decode kernel (kernels/mla_conversion: keys decompressed and rotated inside the
program, values absorbed) under TRITON_INTERPRET on CPU, against a per-sequence torch reference: RoPE on
every dim at positions 0..n-1, GQA groups, with and without a K bias, uneven contexts over shuffled
blocks, one and several context splits. Bound: 1e-5 relative in fp32.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.mla_conversion.kernel import mla_conversion_decode_triton
from tests.unit.test_mla_absorbed_decode import PAGE, paged, rel_err

pytestmark = pytest.mark.kernels


def reference(q, cache, tables, lens, up_k, k_bias, inv_freq, scale, kv_heads) -> torch.Tensor:
    """sum_n p_n c_n per head: p = softmax(q . RoPE_n(W_UK,g c_n + b_K,g) x scale), g the head's KV head."""
    _, heads, dim = q.shape
    half, group = dim // 2, heads // kv_heads
    out = []
    for b, n in enumerate(lens):
        blocks = tables[b, : -(-n // PAGE)].long()
        rows = cache[blocks].reshape(-1, cache.shape[2])[:n].double()  # [n, r]
        k = rows @ up_k.double().T + (0 if k_bias is None else k_bias.double())  # [n, Hkv*D]
        k = k.view(n, kv_heads, dim)
        angle = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq.double()[None]  # [n, D/2]
        cos, sin = angle.cos()[:, None], angle.sin()[:, None]
        k = torch.cat([k[..., :half] * cos - k[..., half:] * sin, k[..., half:] * cos + k[..., :half] * sin], -1)
        k = k.repeat_interleave(group, dim=1)  # [n, H, D]
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].double(), k) * scale, -1)
        out.append(p @ rows)  # [H, r]
    return torch.stack(out).float()


@pytest.mark.parametrize(
    ("lens", "kv_heads", "group", "rank", "bias", "splits"),
    [([1, 19, 40], 2, 2, 24, False, 1), ([33, 7], 1, 3, 16, True, 2), ([65], 2, 1, 40, True, 3)],
)
def test_kernel_matches_the_reference(lens, kv_heads, group, rank, bias, splits) -> None:
    gen = torch.Generator().manual_seed(len(lens) + rank)
    dim, heads = 32, kv_heads * group
    cache, tables = paged(lens, rank, gen)
    context = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), heads, dim, generator=gen)
    up_k = 0.3 * torch.randn(kv_heads * dim, rank, generator=gen)
    k_bias = torch.randn(kv_heads * dim, generator=gen) if bias else None
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    got = mla_conversion_decode_triton(q, cache, up_k, k_bias, inv_freq, tables, context, 0.25, kv_heads, splits)
    want = reference(q, cache, tables, lens, up_k, k_bias, inv_freq, 0.25, kv_heads)
    assert got.shape == (len(lens), heads, rank)
    assert rel_err(got, want) < 1e-5


def test_kernel_refuses_a_head_dim_it_cannot_tile() -> None:
    cache, tables = paged([4], 16, torch.Generator().manual_seed(0))
    with pytest.raises(AssertionError, match="head_dim 16"):
        mla_conversion_decode_triton(torch.zeros(1, 2, 16), cache, torch.zeros(32, 16), None, torch.ones(8),
                                     tables, torch.tensor([4], dtype=torch.int32), 1.0, 2)  # fmt: skip


def test_engine_decodes_the_same_through_the_fused_kernel(tmp_path, monkeypatch) -> None:
    """The conversion with RoPE on every dim, on KVPILOT_KERNELS=triton (every kernel in the interpreter),
    gives the torch backend's greedy tokens and logits; its decode steps go through the fused kernel."""
    from kvpilot.engine.kernels.mla_conversion import kernel
    from kvpilot.engine.llm import LLM
    from kvpilot.engine.sampling_params import SamplingParams
    from tests.helpers.logits import record_logits
    from tests.helpers.models import build_hf_checkpoint

    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=2, num_key_value_heads=2, head_dim=32)
    prompts = [[5, 9, 33, 7, 100, 21, 3, 17, 45, 8, 9], [11, 12, 13]]
    calls = []
    fused = kernel.mla_conversion_decode_triton

    def counted(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(kernel, "mla_conversion_decode_triton", counted)

    def generate(backend: str) -> tuple[list[list[int]], list[torch.Tensor]]:
        monkeypatch.setenv("KVPILOT_KERNELS", backend)
        llm = LLM(str(path), show_progress=False, attention="mla", latent_rank=24, num_kv_blocks=16, block_size=8)
        logits = record_logits(llm.engine.runner.model)
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        return [o["token_ids"] for o in llm.generate(prompts, params)], logits

    want, want_logits = generate("torch")
    assert not calls
    got, got_logits = generate("triton")
    assert got == want
    assert len(calls) == 2 * 5  # 2 layers x 5 decode steps
    for a, b in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_failing_decode_kernel_falls_back_to_the_torch_path(tmp_path, monkeypatch, caplog) -> None:
    """A kernel that does not compile or launch on the device (simulated) is logged once per layer and
    decode takes the torch path from then on: same tokens as the torch backend, no failed request."""
    from kvpilot.engine.kernels.mla_conversion import kernel
    from kvpilot.engine.llm import LLM
    from kvpilot.engine.sampling_params import SamplingParams
    from tests.helpers.models import build_hf_checkpoint

    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=2, num_key_value_heads=2, head_dim=32)
    prompts = [[5, 9, 33, 7, 100, 21, 3, 17, 45, 8, 9], [11, 12, 13]]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    def generate(backend: str) -> tuple[list[list[int]], LLM]:
        monkeypatch.setenv("KVPILOT_KERNELS", backend)
        llm = LLM(str(path), show_progress=False, attention="mla", latent_rank=24, num_kv_blocks=16, block_size=8)
        return [o["token_ids"] for o in llm.generate(prompts, params)], llm

    want, _ = generate("torch")

    def broken(*args, **kwargs):
        raise ValueError("no kernel image is available for execution on the device")

    monkeypatch.setattr(kernel, "mla_conversion_decode_triton", broken)
    got, llm = generate("triton")
    assert got == want
    layers = [layer.self_attn for layer in llm.engine.runner.model.model.layers]
    assert not any(a.kernel_decode for a in layers)
    failures = [r for r in caplog.records if "decode takes the torch path" in r.getMessage()]
    assert len(failures) == len(layers) and "no kernel image" in failures[0].getMessage()
