"""RMSNorm (with and without the fused residual add): the Triton kernel against its torch reference."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.rmsnorm.launcher import rmsnorm_triton
from kvpilot.engine.kernels.rmsnorm.reference import rmsnorm_reference
from tests.kernels.paged_cases import DEVICE

pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "width"), [(1, 64), (15, 300), (63, 128), (4, 1000)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_matches_reference(dtype: torch.dtype, rows: int, width: int, with_residual: bool) -> None:
    gen = torch.Generator().manual_seed(rows * width)
    x = (3 * torch.randn(rows, width, generator=gen)).to(dtype).to(DEVICE)
    residual = torch.randn(rows, width, generator=gen).to(dtype).to(DEVICE) if with_residual else None
    weight = (1 + 0.1 * torch.randn(width, generator=gen)).to(dtype).to(DEVICE)
    want, want_sum = rmsnorm_reference(x, weight, 1e-5, residual)
    got, got_sum = rmsnorm_triton(x, weight, 1e-5, residual)
    if dtype == torch.float32 or DEVICE == "cuda":  # the residual sum rounds as torch's add does
        assert torch.equal(got_sum, want_sum)
    else:  # TRITON_INTERPRET=1 truncates fp32 -> bf16 casts instead of rounding them: within one ulp
        torch.testing.assert_close(got_sum, want_sum, rtol=2**-7, atol=0.0)
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert rel < (1e-6 if dtype == torch.float32 else 1.6e-2), rel  # bf16: a few ulps (the interpreter rounds bf16 casts differently)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-6, "atol": 2e-2}  # 4 bf16 ulps
    torch.testing.assert_close(got, want, **tol)


def test_rmsnorm_of_no_rows_is_empty() -> None:
    x = torch.empty(0, 32, device=DEVICE)
    out, total = rmsnorm_triton(x, torch.ones(32, device=DEVICE), 1e-6, torch.empty(0, 32, device=DEVICE))
    assert out.shape == (0, 32) and total.shape == (0, 32)
