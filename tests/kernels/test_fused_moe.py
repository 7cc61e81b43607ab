"""Fused MoE (kernels/fused_moe): the expert sort and the Triton grouped GEMMs against the torch reference.

Awkward shapes: 1, 3, 17 and 64 tokens, 4 to 64 experts, top-1 to top-6, hidden and intermediate
sizes that no tile divides, and routings with uneven loads (one expert taking most assignments,
experts with none). Relative errors are asserted and recorded (junit property `rel_err`).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvpilot.engine.kernels.fused_moe.align import align_by_expert_torch, align_by_expert_triton, max_blocks
from kvpilot.engine.kernels.fused_moe.launcher import MoeConfig, default_config, fused_moe_triton
from kvpilot.engine.kernels.fused_moe.reference import fused_moe_reference
from tests.kernels.paged_cases import DEVICE

pytestmark = pytest.mark.kernels
# TRITON_INTERPRET=1 truncates fp32 -> bf16 casts (CUDA rounds): five roundings per row drift further there
BF16_REL = 3e-2 if DEVICE == "cpu" else 1e-2
HOST_SYNCS = ("nonzero", "_local_scalar_dense", "item", "masked_select", "unique", "bincount")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12)).item()


def routing(tokens: int, experts: int, top_k: int, load: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32, ids [T, k] distinct per token): `uniform`, `skewed` (expert 0 in every
    token, low ids favoured) or `half-empty` (only the even experts are ever chosen)."""
    scores = torch.rand(tokens, experts, generator=gen)
    if load == "skewed":
        scores = scores + torch.linspace(2.0, 0.0, experts)
        scores[:, 0] = 10.0
    elif load == "half-empty":
        scores[:, 1::2] = -1.0
    ids = scores.topk(top_k, dim=-1).indices
    weights = torch.rand(tokens, top_k, generator=gen) + 0.1
    return weights, ids


def weights_of(experts: int, hidden: int, inter: int, dtype: torch.dtype, gen: torch.Generator):
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    return w13.to(dtype).to(DEVICE), w2.to(dtype).to(DEVICE)


CASES = [  # tokens, experts, top_k, load
    (1, 4, 1, "uniform"), (1, 64, 6, "uniform"), (3, 4, 2, "skewed"), (3, 16, 4, "half-empty"),
    (17, 8, 3, "uniform"), (17, 64, 6, "skewed"), (64, 8, 2, "half-empty"), (64, 32, 6, "skewed"),
]  # fmt: skip


@pytest.mark.parametrize("align", [align_by_expert_torch, align_by_expert_triton], ids=["torch", "triton"])
@pytest.mark.parametrize(("tokens", "experts", "top_k", "load"), CASES)
def test_align_sorts_every_assignment_into_expert_blocks(align, tokens: int, experts: int, top_k: int,
                                                         load: str) -> None:
    gen = torch.Generator().manual_seed(tokens * 100 + experts)
    ids = routing(tokens, experts, top_k, load, gen)[1].to(DEVICE)
    for block_m in (16, 32):
        blocks = align(ids, experts, block_m)
        n = tokens * top_k
        sorted_ids = blocks.sorted_ids.cpu()
        assert sorted_ids.numel() == blocks.block_experts.numel() * block_m == max_blocks(n, experts, block_m) * block_m
        counts = Counter(ids.flatten().tolist())
        used = sum(-(-c // block_m) * block_m for c in counts.values())
        assert int(blocks.num_padded.item()) == used
        sorted_ids = sorted_ids[:used]  # rows past the padded total are never read
        assert sorted(sorted_ids[sorted_ids < n].tolist()) == list(range(n))  # every assignment exactly once
        assert ((sorted_ids >= 0) & (sorted_ids <= n)).all()  # the rest are pad rows
        flat = ids.flatten().cpu()
        for b in range(used // block_m):
            rows = sorted_ids[b * block_m : (b + 1) * block_m]
            rows = rows[rows < n]
            assert rows.numel() and (flat[rows.long()] == int(blocks.block_experts[b])).all()  # one expert per block
            assert rows.tolist() == sorted(rows.tolist())  # in assignment order
        want = align_by_expert_torch(ids, experts, block_m)
        assert torch.equal(blocks.sorted_ids[:used], want.sorted_ids[:used])
        assert torch.equal(blocks.block_experts[: used // block_m], want.block_experts[: used // block_m])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "experts", "top_k", "load"), CASES)
def test_fused_moe_matches_reference(record_property, dtype, tokens: int, experts: int, top_k: int, load: str) -> None:
    hidden, inter = 48, 40  # neither divides the tiles
    gen = torch.Generator().manual_seed(tokens + experts + top_k)
    weights, ids = routing(tokens, experts, top_k, load, gen)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(DEVICE)
    w13, w2 = weights_of(experts, hidden, inter, dtype, gen)
    weights, ids = weights.to(DEVICE), ids.to(DEVICE)
    want = fused_moe_reference(x, w13, w2, weights, ids)
    config = MoeConfig(16, 16, 16) if (tokens + top_k) % 2 else MoeConfig(32, 32, 32)  # both tile heights
    got = fused_moe_triton(x, w13, w2, weights, ids, config)
    err = rel_err(got, want)
    record_property("rel_err", err)
    assert got.dtype == dtype and got.shape == want.shape
    assert err < (1e-5 if dtype == torch.float32 else BF16_REL), (config, err)


def test_default_config_grows_with_rows_per_expert() -> None:
    assert default_config(6, 64).block_m == 16  # batch-1 decode, DeepSeek-V2-Lite
    assert default_config(64 * 6, 64).block_m == 16
    assert default_config(256 * 6, 64).block_m == 32
    assert default_config(1024 * 6, 64).block_m == 64
    assert default_config(16384 * 6, 64).block_m == 128


def test_default_tiles_match_reference_on_model_like_shapes(record_property) -> None:
    """The tiles the engine launches (default_config) over sizes larger than one tile, with an empty expert."""
    gen = torch.Generator().manual_seed(7)
    hidden, inter, experts, top_k, tokens = 160, 136, 8, 2, 5
    weights, ids = routing(tokens, experts, top_k, "half-empty", gen)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE)
    w13, w2 = weights_of(experts, hidden, inter, torch.float32, gen)
    got = fused_moe_triton(x, w13, w2, weights.to(DEVICE), ids.to(DEVICE))
    err = rel_err(got, fused_moe_reference(x, w13, w2, weights.to(DEVICE), ids.to(DEVICE)))
    record_property("rel_err", err)
    assert err < 1e-5, err


class OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.name()] += 1
        return func(*args, **(kwargs or {}))


def test_fused_moe_dispatches_no_host_sync() -> None:
    """What a CUDA graph captures: the sort and both GEMMs with no op that waits for the device."""
    gen = torch.Generator().manual_seed(3)
    weights, ids = routing(17, 16, 4, "skewed", gen)
    x = torch.randn(17, 48, generator=gen).to(DEVICE)
    w13, w2 = weights_of(16, 48, 40, torch.float32, gen)
    recorder = OpRecorder()
    with recorder:
        fused_moe_triton(x, w13, w2, weights.to(DEVICE), ids.to(DEVICE), MoeConfig(16, 16, 16))
    syncs = {op: n for op, n in recorder.ops.items() if op.split("::")[-1].split(".")[0] in HOST_SYNCS}
    assert recorder.ops and syncs == {}, syncs


def test_zero_tokens_give_an_empty_output() -> None:
    x = torch.zeros(0, 48, device=DEVICE)
    w13, w2 = weights_of(4, 48, 40, torch.float32, torch.Generator().manual_seed(0))
    ids = torch.zeros(0, 2, dtype=torch.long, device=DEVICE)
    assert fused_moe_triton(x, w13, w2, torch.zeros(0, 2, device=DEVICE), ids).shape == (0, 48)
