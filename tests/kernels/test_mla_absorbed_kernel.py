"""The partial-RoPE MLA conversion's GPU decode: the native mla_decode Triton kernel with `pe_group` (each
head's rope query masked into its KV head's columns, strategies/mla/absorbed.py), under TRITON_INTERPRET
on CPU, against the batched torch path and against the kernel fed the explicit block-diagonal query.

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
    ("lens", "kv_heads", "group", "rope", "splits"),
    # 40 heads: the default launch takes 32 heads per program (mla_block_h), then a ragged block of 8
    [([1, 19, 40], 2, 2, 4, 1), ([24, 7], 1, 3, 2, 2), ([33, 6], 8, 5, 2, 2)],
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


def test_grouped_rope_query_equals_the_block_diagonal_one() -> None:
    """pe_group=R (the masked load) is the shared-rope kernel fed head h's q_rope in columns g*R..(g+1)*R
    of a zero [Hkv x R] query, g its KV head: built here explicitly, as the path did before session 8."""
    from kvpilot.engine.kernels.mla_decode.kernel import mla_decode_triton

    gen = torch.Generator().manual_seed(7)
    lens, kv_heads, group, rope, rank = [5, 30], 2, 3, 4, 16
    heads = kv_heads * group
    cache, tables = paged(lens, rank + kv_heads * rope, gen)
    context = torch.tensor(lens, dtype=torch.int32)
    q_lat = torch.randn(len(lens), heads, rank, generator=gen)
    q_rope = torch.randn(len(lens), heads, rope, generator=gen)
    eye = torch.eye(kv_heads).repeat_interleave(group, dim=0)  # [H, Hkv]: head h -> its KV head
    block_diagonal = (eye[None, :, :, None] * q_rope[:, :, None, :]).reshape(
        len(lens), heads, kv_heads * rope
    )
    want = mla_decode_triton(q_lat, block_diagonal, cache, tables, context, 0.3)
    got = mla_decode_triton(q_lat, q_rope, cache, tables, context, 0.3, pe_group=rope)
    assert rel_err(got, want) < 1e-6
    with pytest.raises(AssertionError, match="rope part"):
        mla_decode_triton(q_lat, q_rope[:, :, :3], cache, tables, context, 0.3, pe_group=3)


def test_engine_decodes_the_same_through_the_kernel(tmp_path, monkeypatch) -> None:
    """The engine's decode on KVPILOT_KERNELS=triton (every kernel in the interpreter; the engine passes
    its own int32 block tables and context lengths) gives the torch backend's greedy tokens."""
    from kvpilot.engine.llm import LLM
    from kvpilot.engine.sampling_params import SamplingParams
    from kvpilot.engine.strategies.mla import partial
    from tests.helpers.models import build_hf_checkpoint

    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=2, num_key_value_heads=2)
    prompts = [[5, 9, 33, 7, 100, 21, 3, 17, 45, 8, 9], [11, 12, 13]]
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return latent_attention_triton(*args, **kwargs)

    monkeypatch.setattr(partial, "latent_attention_triton", counted)

    def generate(backend: str) -> list[list[int]]:
        monkeypatch.setenv("KVPILOT_KERNELS", backend)
        llm = LLM(str(path), show_progress=False, attention="mla", latent_rank=20, mla_rope_dims=6,
                  num_kv_blocks=16, block_size=8)  # fmt: skip
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        return [o["token_ids"] for o in llm.generate(prompts, params)]

    want = generate("torch")
    assert not calls
    assert generate("triton") == want
    assert len(calls) == 2 * 5  # 2 layers x 5 decode steps
