"""ModelRunner._prepare (vectorised, incremental block tables, packed copies) builds exactly the step
inputs of the plain per-token loop it replaced: ids, positions, slots, tables, lengths, sample rows."""

from __future__ import annotations

import random

import pytest
import torch

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.core.scheduler import ScheduledSeq, SchedulerOutput
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BLOCK = 4


def reference(out: SchedulerOutput, bs: int) -> dict:
    """The step inputs as the original loop computed them (one Python iteration per token)."""
    order = [i for i, s in enumerate(out.scheduled) if s.num_new_tokens > 1]
    order += [i for i, s in enumerate(out.scheduled) if s.num_new_tokens == 1]
    ids, positions, slots, sample_rows = [], [], [], []
    for i in order:
        item = out.scheduled[i]
        seq, start = item.seq, item.seq.num_computed_tokens
        end = start + item.num_new_tokens
        ids += seq.token_ids[start:end]
        positions += range(start, end)
        ev = seq.num_evicted_tokens
        slots += [seq.block_table[(p - ev) // bs] * bs + (p - ev) % bs for p in range(start, end)]
        if item.samples:
            sample_rows.append((i, len(ids) - 1))
    prefill = [out.scheduled[i] for i in order if out.scheduled[i].num_new_tokens > 1]
    decode = [out.scheduled[i] for i in order if out.scheduled[i].num_new_tokens == 1]
    want = {"ids": ids, "positions": positions, "slots": slots, "sample_rows": sample_rows,
            "num_prefill_tokens": sum(s.num_new_tokens for s in prefill)}
    for name, group in (("prefill", prefill), ("decode", decode)):
        if group:
            want[f"{name}_tables"] = [s.seq.block_table for s in group]
            want[f"{name}_lens"] = [s.seq.num_computed_tokens - s.seq.num_evicted_tokens + s.num_new_tokens
                                    for s in group]
    if prefill:
        cu = [0]
        for s in prefill:
            cu.append(cu[-1] + s.num_new_tokens)
        want["cu"] = cu
    return want


def check_tables(got: torch.Tensor, want: list[list[int]]) -> None:
    assert got.dtype == torch.int32 and got.shape[0] == len(want)
    assert got.shape[1] % 16 == 0 and got.shape[1] >= max(len(t) for t in want)
    for row, table in zip(got.tolist(), want, strict=True):
        assert row[: len(table)] == table
        assert all(v == -1 for v in row[len(table) :])


def check_prepare(engine: LLMEngine, out: SchedulerOutput) -> None:
    ctx, ids, positions, sample_rows = engine.runner._prepare(out)
    want = reference(out, engine.runner.block_size)
    assert ids.dtype == positions.dtype == torch.long
    assert ids.tolist() == want["ids"]
    assert positions.tolist() == want["positions"]
    assert ctx.slot_mapping.dtype == torch.int32 and ctx.slot_mapping.tolist() == want["slots"]
    assert sample_rows == want["sample_rows"]
    assert ctx.num_prefill_tokens == want["num_prefill_tokens"]
    if "prefill_tables" in want:
        check_tables(ctx.block_tables, want["prefill_tables"])
        assert ctx.context_lens.tolist() == want["prefill_lens"]
        assert ctx.cu_seqlens_q.tolist() == want["cu"]
    else:
        assert ctx.block_tables is None and ctx.cu_seqlens_q is None
    if "decode_tables" in want:
        check_tables(ctx.decode_block_tables, want["decode_tables"])
        assert ctx.decode_context_lens.tolist() == want["decode_lens"]
    else:
        assert ctx.decode_block_tables is None
    index = engine.runner._sample_index
    rows = [r for _, r in sample_rows]
    if index is None:  # nothing samples, or every row does, in order: no gather
        assert rows in ([], list(range(len(want["ids"]))))
    else:
        assert index.tolist() == rows


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    path = make_model(tmp_path_factory.mktemp("prepare") / "tiny", "llama", "tiny")
    return LLMEngine(EngineConfig(model=str(path), device="cpu", block_size=BLOCK, num_kv_blocks=4096,
                                  show_progress=False))


@pytest.fixture(params=["direct", "staged"])
def engine(cpu_engine: LLMEngine, request: pytest.FixtureRequest):
    """'staged': the CUDA path's reused host buffers (unpinned here), which every step rewrites."""
    cpu_engine.runner.stager.staged = request.param == "staged"
    yield cpu_engine
    cpu_engine.runner.stager.staged = False


def random_seq(rng: random.Random, name: str, next_block: list[int]) -> tuple[Sequence, int]:
    """A sequence with a block table covering its computed tokens plus a chunk; returns (seq, chunk)."""
    length = rng.randrange(2, 120)
    seq = Sequence(name, [rng.randrange(3, 300) for _ in range(length)], SamplingParams(max_tokens=8))
    seq.num_computed_tokens = rng.randrange(0, length)
    chunk = rng.randrange(1, length - seq.num_computed_tokens + 1)
    if rng.random() < 0.3 and seq.num_computed_tokens >= 2 * BLOCK:  # eviction dropped whole leading blocks
        seq.num_evicted_tokens = BLOCK * rng.randrange(1, seq.num_computed_tokens // BLOCK)
    resident = seq.num_computed_tokens - seq.num_evicted_tokens + chunk
    blocks = -(-resident // BLOCK) + rng.randrange(0, 2)  # sometimes one spare block already held
    seq.block_table = rng.sample(range(next_block[0], next_block[0] + 4 * blocks), blocks)
    next_block[0] += 4 * blocks
    return seq, chunk


def test_random_steps_match_the_per_token_loop(engine: LLMEngine) -> None:
    rng = random.Random(0)
    for step in range(40):
        next_block = [0]
        items = [ScheduledSeq(*random_seq(rng, f"s{step}-{i}", next_block)) for i in range(rng.randrange(1, 9))]
        if rng.random() < 0.5:  # a pure decode step
            for item in items:
                item.num_new_tokens = 1
        check_prepare(engine, SchedulerOutput(items))
        for item in items:
            engine.runner.release(item.seq.request_id)


def test_tables_follow_a_sequence_across_steps(engine: LLMEngine) -> None:
    """The mirror is incremental: growth, eviction's new list and a reused request id all show up."""
    seq = Sequence("grow", list(range(3, 3 + 9)), SamplingParams(max_tokens=64))
    seq.block_table = [11, 12, 13]
    for _ in range(12):
        seq.num_computed_tokens = len(seq)
        seq.append_token(5)
        if (len(seq) - 1 - seq.num_evicted_tokens) // BLOCK >= len(seq.block_table):
            seq.block_table.append(100 + len(seq.block_table))
        check_prepare(engine, SchedulerOutput([ScheduledSeq(seq, 1)]))
    seq.block_table = [11, *seq.block_table[3:]]  # eviction: a new, shorter list
    seq.num_evicted_tokens = 2 * BLOCK
    check_prepare(engine, SchedulerOutput([ScheduledSeq(seq, 1)]))
    engine.runner.release("grow")
    again = Sequence("grow", [3, 4, 5], SamplingParams(max_tokens=4))
    again.block_table = [7]
    check_prepare(engine, SchedulerOutput([ScheduledSeq(again, 3)]))
    engine.runner.release("grow")
