"""DeepSeek's RoPE (kernels/mla_rope): the Triton kernel against the torch reference (HF's math).

Strided views as the model passes them (q's rope dims inside [T, H, Dn + R], k_pe inside the
kv_a projection's rows), interleaved and rotate-half pairs, a YaRN attention factor, positions up to
DeepSeek-V2's 160k context; relative errors asserted.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.mla_rope.launcher import mla_rope_triton
from kvpilot.engine.kernels.mla_rope.reference import mla_rope_reference
from kvpilot.engine.models.deepseek_v2 import deepseek_rope
from tests.kernels.paged_cases import DEVICE

pytestmark = pytest.mark.kernels
YARN = {"factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
        "mscale_all_dim": 0.707}  # fmt: skip


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize(("tokens", "heads", "nope", "rope", "yarn"), [
    (1, 16, 128, 64, YARN), (15, 3, 16, 8, None), (63, 1, 0, 64, YARN), (4, 5, 10, 6, None),
])  # fmt: skip
def test_mla_rope_matches_reference(dtype, interleave: bool, tokens: int, heads: int, nope: int, rope: int,
                                    yarn: dict | None) -> None:
    gen = torch.Generator().manual_seed(tokens * heads + rope)
    inv_freq, factor = deepseek_rope(rope, 10000.0, yarn)
    positions = torch.randint(0, 163840, (tokens,), generator=gen).to(DEVICE)
    q = torch.randn(tokens, heads, nope + rope, generator=gen).to(dtype).to(DEVICE)
    x = q[..., nope:]  # the rope dims of each head: strided rows
    want = mla_rope_reference(positions, inv_freq.to(DEVICE), x, factor, interleave)
    got = mla_rope_triton(positions, inv_freq.to(DEVICE), x, factor, interleave)
    err = rel_err(got, want)
    assert got.shape == x.shape and got.dtype == dtype
    assert err < (1e-5 if dtype == torch.float32 else 1.6e-2), err


def test_mla_rope_of_the_shared_key_inside_its_projection_row() -> None:
    """k_pe is the last R columns of kv_a_proj's [T, L + R] output, viewed as [T, 1, R]."""
    gen = torch.Generator().manual_seed(1)
    inv_freq, factor = deepseek_rope(64, 10000.0, YARN)
    rows = torch.randn(9, 512 + 64, generator=gen).to(DEVICE)
    positions = torch.arange(9).to(DEVICE) * 1000
    k_pe = rows[:, 512:][:, None, :]
    want = mla_rope_reference(positions, inv_freq.to(DEVICE), k_pe, factor, True)
    got = mla_rope_triton(positions, inv_freq.to(DEVICE), k_pe, factor, True)
    assert rel_err(got, want) < 1e-5
