"""The fused small-batch linear + residual add + RMSNorm (+ SiLU input): the Triton kernel against the
torch composition it replaces, its ticket counters, and its refusals."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels import linear_add_rmsnorm
from kvpilot.engine.kernels.gemv_norm.launcher import (
    MAX_ROWS,
    GemvConfig,
    counters,
    gemv_config,
    linear_add_rmsnorm_triton,
)
from kvpilot.engine.kernels.gemv_norm.reference import linear_add_rmsnorm_reference
from tests.kernels.paged_cases import DEVICE, REL_TOL, relative_error

pytestmark = pytest.mark.kernels

CASES = [  # (rows, n, k, config): K splits that do not divide K, ragged row blocks, the default launch
    (1, 96, 300, GemvConfig(block_n=16, block_k=64, split_k=3)),
    (3, 64, 128, None),
    (1, 200, 64, GemvConfig(block_n=16, block_k=32, split_k=1)),
    (2, 48, 1000, GemvConfig(block_n=32, block_k=128, split_k=5)),
    (1, 40, 2500, None),  # the default launch's two K splits, the last one ragged
    (1, 48, 8200, None),  # and its 32-row blocks over long rows
    (1, 96, 300, GemvConfig(block_n=16, block_k=64, split_k=3, split_epilogue=True)),  # the two-level epilogue
    (3, 200, 1000, GemvConfig(block_n=16, block_k=128, split_k=2, split_epilogue=True)),  # ragged, 13 blocks
    (2, 64, 128, GemvConfig(block_n=32, block_k=64, split_k=1, split_epilogue=True)),
]


def _inputs(rows: int, n: int, k: int, silu: bool, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2 * k if silu else k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k**0.5
    res = torch.randn(rows, n, generator=gen)
    norm_w = 1 + 0.1 * torch.randn(n, generator=gen)
    return tuple(t.to(dtype).to(DEVICE) for t in (x, w, res, norm_w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_gemv_matches_the_composition(case: int, silu: bool, dtype: torch.dtype) -> None:
    rows, n, k, cfg = CASES[case]
    x, w, res, norm_w = _inputs(rows, n, k, silu, dtype, seed=case)
    want, want_sum = linear_add_rmsnorm_reference(x, w, res, norm_w, 1e-5, silu)
    for _ in range(2):  # the second launch meets the counters the first one reset
        got, got_sum = linear_add_rmsnorm_triton(x, w, res, norm_w, 1e-5, silu, cfg)
        assert relative_error(got_sum, want_sum) < REL_TOL[dtype]
        assert relative_error(got, want) < 2 * REL_TOL[dtype]  # the norm adds its own rounding
    assert int(counters(x.device, 1).abs().sum()) == 0, "every row's counter is back at 0"


def test_the_default_launch_follows_the_measured_rule() -> None:
    """gemv_config: the sweep's best at Llama-3-8B's o_proj and down_proj (docs/benchmarks.md, session 18)."""
    cpu = torch.device("cpu")
    assert gemv_config(4096, 4096, cpu) == GemvConfig(block_n=16, block_k=512, split_k=2)
    assert gemv_config(4096, 14336, cpu) == GemvConfig(block_n=32, block_k=512, split_k=2)
    assert gemv_config(64, 128, cpu) == GemvConfig(block_n=16, block_k=128, split_k=1)


def test_the_epilogue_sees_every_split() -> None:
    """A weight whose rows only one K split can see: a reduction that missed a split (or ran before
    the last ticket) gives a different sum."""
    n, k = 32, 512
    x = torch.ones(1, k, device=DEVICE)
    w = torch.zeros(n, k, device=DEVICE)
    for split in range(4):
        w[split * 8 : (split + 1) * 8, split * 128 : (split + 1) * 128] = 1.0
    res = torch.zeros(1, n, device=DEVICE)
    _, total = linear_add_rmsnorm_triton(x, w, res, torch.ones(n, device=DEVICE), 1e-6, False,
                                         GemvConfig(block_n=16, block_k=64, split_k=4))  # fmt: skip
    assert torch.equal(total, torch.full((1, n), 128.0, device=DEVICE))


def test_the_op_dispatches_by_rows_and_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, res, norm_w = _inputs(2, 64, 96, False, torch.float32, seed=7)
    want = linear_add_rmsnorm_reference(x, w, res, norm_w, 1e-5)
    for backend in ("torch", "triton"):
        monkeypatch.setenv("KVPILOT_KERNELS", backend)
        got = linear_add_rmsnorm(x, w, res, norm_w, 1e-5)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bad_calls_are_refused() -> None:
    x, w, res, norm_w = _inputs(1, 64, 96, False, torch.float32, seed=1)
    with pytest.raises(AssertionError, match="weight"):
        linear_add_rmsnorm_triton(x[:, :90], w, res, norm_w, 1e-5)
    with pytest.raises(AssertionError, match="residual"):
        linear_add_rmsnorm_triton(x, w, res[:, :60], norm_w, 1e-5)
    with pytest.raises(AssertionError, match="one dtype"):
        linear_add_rmsnorm_triton(x, w.double(), res, norm_w, 1e-5)
    big = torch.zeros(MAX_ROWS + 1, 96, device=DEVICE)
    with pytest.raises(ValueError, match=f"at most {MAX_ROWS} rows"):
        linear_add_rmsnorm_triton(big, w, torch.zeros(MAX_ROWS + 1, 64, device=DEVICE), norm_w, 1e-5)
