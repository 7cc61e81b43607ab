"""The recurrent-state pool's bookkeeping (torch-free): slots never leak or double-free, hits/misses."""

from __future__ import annotations

import random

import pytest

from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.scheduler import Scheduler
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.core.state_pool import StatePool
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


def test_cold_start_is_a_miss_then_steps_hit() -> None:
    pool = StatePool(2)
    slot, fresh = pool.resolve("a", 0)
    assert fresh and (pool.hits_total, pool.misses_total) == (0, 1)
    pool.advance("a", 5)
    assert pool.resolve("a", 5) == (slot, False)
    pool.advance("a", 1)
    assert pool.resolve("a", 6) == (slot, False)
    assert (pool.hits_total, pool.misses_total) == (2, 1)


def test_preempted_sequence_rebuilds_in_a_new_slot_and_counts_a_miss() -> None:
    pool = StatePool(2)
    pool.resolve("a", 0)
    pool.advance("a", 7)
    assert pool.free("a") and not pool.free("a")
    _, fresh = pool.resolve("a", 0)
    assert fresh and pool.misses_total == 2
    pool.check()


def test_stale_state_is_a_miss_and_resuming_mid_sequence_without_state_is_refused() -> None:
    pool = StatePool(1)
    slot, _ = pool.resolve("a", 0)
    pool.advance("a", 4)
    # the sequence restarts from token 0 (its state was not freed): rebuilt in place, a miss
    assert pool.resolve("a", 0) == (slot, True)
    with pytest.raises(RuntimeError, match="rebuilt from token 0"):
        pool.resolve("b", 3)  # e.g. a prefix-cache hit: no state covers those 3 tokens


def test_exhausted_pool_says_so() -> None:
    pool = StatePool(1)
    pool.resolve("a", 0)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.resolve("b", 0)
    with pytest.raises(ValueError, match="at least one slot"):
        StatePool(0)


@pytest.mark.parametrize("seed", range(6))
def test_random_add_finish_abort_preempt_keeps_every_slot_accounted(seed: int) -> None:
    """Drive the real scheduler (tiny KV pool: preemptions happen) the way LLMEngine drives the
    state pool: free on preempt/finish/abort, resolve + advance per scheduled chunk."""
    rng = random.Random(seed)
    max_seqs = 4
    bm = BlockManager(num_blocks=12, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=max_seqs, max_num_batched_tokens=10, max_model_len=40)
    pool = StatePool(max_seqs)
    live: dict[str, Sequence] = {}
    preempted_seen = 0
    steps_scheduled = 0
    rebuilds = 0
    for i in range(300):
        if rng.random() < 0.3 and len(live) < 10:
            rid = f"r{i}"
            live[rid] = Sequence(rid, [1] * rng.randint(1, 16), SamplingParams(max_tokens=rng.randint(1, 12)))
            sched.add(live[rid])
        if live and rng.random() < 0.05:
            rid = rng.choice(sorted(live))
            sched.abort(rid)
            pool.free(rid)
            del live[rid]
        out = sched.schedule()
        for seq in out.preempted:
            pool.free(seq.request_id)
            preempted_seen += 1
        sampled: list[int | None] = []
        for item in out.scheduled:
            _, fresh = pool.resolve(item.seq.request_id, item.seq.num_computed_tokens)
            rebuilds += fresh
            pool.advance(item.seq.request_id, item.num_new_tokens)
            steps_scheduled += 1
            sampled.append(5 if item.samples else None)
        for seq in sched.postprocess(out, sampled):
            pool.free(seq.request_id)
            live.pop(seq.request_id)
        pool.check()
        assert set(pool.owners) <= {s.request_id for s in sched.running}
        assert pool.num_used <= max_seqs
    assert preempted_seen > 0, "the tiny KV pool was meant to force preemption"
    assert pool.hits_total + pool.misses_total == steps_scheduled
    assert pool.misses_total == rebuilds
