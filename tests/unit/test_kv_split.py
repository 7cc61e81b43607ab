"""A step's tokens by KV pool (layers/pool_split.split_step) for two-pool caches: int8/fp8 with a
16-bit fallback reserve, auto switching. A step whose sequences are all in one pool takes the host-sync-free
path (what CUDA graphs capture) and must equal the host split (split_by_pool) row for row; the runner
counts the step's exact-pool sequences from its host block tables."""

from __future__ import annotations

import random

import pytest
import torch

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.context import Context
from kvpilot.engine.core.scheduler import ScheduledSeq, SchedulerOutput
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.layers.pool_split import KVSplit, split_by_pool, split_step
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BS, FIRST8 = 4, 90  # block size; the 8-bit pool's first block id (the 16-bit pool holds 0..89)


def step_context(seqs: list[tuple[list[int], int, int]], exact: int | None, device: str = "cpu") -> Context:
    """seqs: (block table, tokens computed before, new tokens) per sequence, chunks (new > 1) first."""
    prefill = [s for s in seqs if s[2] > 1]
    decode = [s for s in seqs if s[2] == 1]
    assert seqs == prefill + decode
    width = -(-max(len(t) for t, _, _ in seqs) // 16) * 16

    def ints(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    def tables(group: list) -> torch.Tensor:
        return ints([t + [-1] * (width - len(t)) for t, _, _ in group])

    slots = [t[p // BS] * BS + p % BS for t, start, n in seqs for p in range(start, start + n)]
    ctx = Context(slot_mapping=ints(slots), num_prefill_tokens=sum(n for _, _, n in prefill), exact_pool_seqs=exact)
    if prefill:
        cu = [0]
        for _, _, n in prefill:
            cu.append(cu[-1] + n)
        ctx.block_tables, ctx.context_lens, ctx.cu_seqlens_q = tables(prefill), ints([s + n for _, s, n in prefill]), ints(cu)
    if decode:
        ctx.decode_block_tables, ctx.decode_context_lens = tables(decode), ints([s + 1 for _, s, _ in decode])
    return ctx


def random_step(rng: random.Random, pools: list[str]) -> list[tuple[list[int], int, int]]:
    """One sequence per entry of pools ('16' / '8'), each with blocks of its pool; chunks first."""
    free = {"16": list(range(FIRST8)), "8": list(range(FIRST8, FIRST8 + 200))}
    for ids in free.values():
        rng.shuffle(ids)
    seqs = []
    for pool in pools:
        start = rng.randrange(0, 40)
        new = 1 if rng.random() < 0.5 else rng.randrange(2, 20)
        blocks = -(-(start + new) // BS)
        seqs.append(([free[pool].pop() for _ in range(blocks)], start, new))
    return sorted(seqs, key=lambda s: s[2] == 1)  # stable: chunks first


def rows_of(split: KVSplit, num_tokens: int) -> list[tuple]:
    """Each part's (prefill, quant, rows, tables, lens, cu) as lists; row slices expanded."""
    out = []
    for p in split.parts:
        rows = list(range(num_tokens))[p.rows] if isinstance(p.rows, slice) else p.rows.tolist()
        cu = None if p.cu_seqlens_q is None else p.cu_seqlens_q.tolist()
        out.append((p.prefill, p.quant, rows, p.block_tables.tolist(), p.context_lens.tolist(), cu))
    return out


def slots_of(slots: torch.Tensor | None, num_tokens: int) -> list[int]:
    return [-1] * num_tokens if slots is None else slots.tolist()


@pytest.mark.parametrize("pool", ["8", "16"])
@pytest.mark.parametrize("seed", range(12))
def test_one_pool_step_equals_the_host_split(pool: str, seed: int) -> None:
    rng = random.Random(seed)
    seqs = random_step(rng, [pool] * rng.randrange(1, 7))
    exact = 0 if pool == "8" else len(seqs)
    ctx = step_context(seqs, exact)
    n = ctx.slot_mapping.shape[0]
    got, want = split_step(ctx, n, FIRST8, BS), split_by_pool(ctx, n, FIRST8, BS)
    assert rows_of(got, n) == rows_of(want, n)
    assert slots_of(got.slots8, n) == slots_of(want.slots8, n)
    assert slots_of(got.slots16, n) == slots_of(want.slots16, n)
    assert all(isinstance(p.rows, slice) for p in got.parts)  # the step's metadata as it is, no gather
    if pool == "8":
        assert got.slots16 is None and min(got.slots8.tolist()) >= 0
        assert all(p.quant for p in got.parts)
        assert max(p.block_tables.max().item() for p in got.parts) < 200  # rebased into the 8-bit pool's ids


def test_padding_stays_padding_when_rebased() -> None:
    """CUDA-graph static buffers pad rows with slot -1 and -1 table entries: they must write and read nothing."""
    ctx = step_context([([FIRST8 + 3, FIRST8], 5, 1), ([FIRST8 + 9], 0, 1)], 0)
    ctx.slot_mapping = torch.cat([ctx.slot_mapping, torch.tensor([-1, -1], dtype=torch.int32)])
    pad = torch.full((2, ctx.decode_block_tables.shape[1]), -1, dtype=torch.int32)
    ctx.decode_block_tables = torch.cat([ctx.decode_block_tables, pad])
    ctx.decode_context_lens = torch.cat([ctx.decode_context_lens, torch.zeros(2, dtype=torch.int32)])
    split = split_step(ctx, 4, FIRST8, BS)
    assert split.slots8.tolist() == [0 * BS + 1, 9 * BS, -1, -1]  # position 5: second block (FIRST8), offset 1
    tables = split.parts[0].block_tables
    assert tables[:2, :2].tolist() == [[3, 0], [9, -1]] and (tables[2:] == -1).all() and (tables[:, 2:] == -1).all()


def test_one_pool_step_reads_nothing_on_the_host() -> None:
    """On meta tensors (no values: any host read raises) the one-pool paths still build the split."""
    seqs = [([FIRST8 + 1, FIRST8 + 2], 3, 4), ([FIRST8 + 7], 2, 1)]
    for exact in (0, 2):
        split = split_step(step_context(seqs, exact, device="meta"), 5, FIRST8, BS)
        assert [p.prefill for p in split.parts] == [True, False]
    with pytest.raises(NotImplementedError):  # the host split does read: the fixture really has no values
        split_step(step_context(seqs, 1, device="meta"), 5, FIRST8, BS)


@pytest.mark.parametrize("exact", [1, None])
def test_mixed_or_uncounted_step_splits_on_the_host(exact: int | None) -> None:
    rng = random.Random(3)
    seqs = random_step(rng, ["16", "8", "8", "16", "8"])
    ctx = step_context(seqs, exact)
    n = ctx.slot_mapping.shape[0]
    got, want = split_step(ctx, n, FIRST8, BS), split_by_pool(ctx, n, FIRST8, BS)
    assert rows_of(got, n) == rows_of(want, n)
    assert {p.quant for p in got.parts} == {True, False}


# -- the runner's count ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def int8_reserve_engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    path = make_model(tmp_path_factory.mktemp("kv-split") / "tiny", "llama", "tiny")
    return LLMEngine(EngineConfig(model=str(path), device="cpu", block_size=BS, num_kv_blocks=200,
                                  kv_cache_dtype="int8", fallback_reserve=0.2, show_progress=False))


def test_runner_counts_the_step_sequences_in_the_reserve(int8_reserve_engine: LLMEngine) -> None:
    runner = int8_reserve_engine.runner
    n16, _ = runner.kv_pool_sizes
    assert runner.first_approx_block == n16 > 0
    rng = random.Random(1)
    for step in range(20):
        on_reserve = [rng.random() < 0.3 for _ in range(rng.randrange(1, 7))]
        items = []
        for i, reserve in enumerate(on_reserve):
            seq = Sequence(f"s{step}-{i}", [rng.randrange(3, 300) for _ in range(rng.randrange(2, 30))],
                           SamplingParams(max_tokens=4))
            seq.num_computed_tokens = len(seq) - 1 if rng.random() < 0.5 else 0
            first = rng.randrange(0, n16 - 8) if reserve else rng.randrange(n16, n16 + 100)
            seq.block_table = list(range(first, first + -(-len(seq) // BS)))
            items.append(ScheduledSeq(seq, len(seq) - seq.num_computed_tokens))
        ctx, *_ = runner._prepare(SchedulerOutput(items))
        assert ctx.exact_pool_seqs == sum(on_reserve)
        for item in items:
            runner.release(item.seq.request_id)
