"""Scheduler invariants: token budget, max_num_seqs, preemption, abort, no leaked blocks."""

from __future__ import annotations

import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.scheduler import Scheduler
from kvpilot.engine.core.sequence import Sequence, SequenceStatus
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

EOS = 0


def make_scheduler(num_blocks=32, block_size=4, max_num_seqs=4, budget=16, chunked=True, caching=True):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    return Scheduler(
        bm,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=num_blocks * block_size,
        enable_chunked_prefill=chunked,
        eos_token_ids=(EOS,),
    )


def seq(name: str, n: int, max_tokens: int = 4, base: int = 1) -> Sequence:
    return Sequence(
        name, [base + (i % 50) for i in range(n)], SamplingParams(temperature=0, max_tokens=max_tokens)
    )


def run_step(sched: Scheduler, rng: random.Random) -> list[Sequence]:
    out = sched.schedule()
    assert out.num_tokens <= sched.max_num_batched_tokens
    assert len(sched.running) <= sched.max_num_seqs
    sampled = [rng.randint(1, 60) if s.samples else None for s in out.scheduled]
    for s in out.scheduled:
        assert s.num_new_tokens >= 1
        assert (
            len(s.seq.block_table) * sched.block_manager.block_size
            >= s.seq.num_computed_tokens + s.num_new_tokens
        )
    return sched.postprocess(out, sampled)


def check(sched: Scheduler, everyone: list[Sequence]) -> None:
    bm = sched.block_manager
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    holders: dict[int, int] = {}
    for s in everyone:
        if s.status != SequenceStatus.RUNNING:
            assert s.block_table == [], f"{s} holds blocks while not running"
        for b in s.block_table:
            holders[b] = holders.get(b, 0) + 1
    for block in bm.blocks:
        assert block.ref_count == holders.get(block.block_id, 0)
    assert all(s.status == SequenceStatus.RUNNING for s in sched.running)
    assert all(s.status == SequenceStatus.WAITING for s in sched.waiting)


def test_chunked_prefill_mixes_with_decode() -> None:
    sched = make_scheduler(budget=8)
    a, b = seq("a", 3, max_tokens=5), seq("b", 20)
    sched.add(a)
    out = sched.schedule()
    sched.postprocess(out, [5])
    sched.add(b)
    out = sched.schedule()
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 7)]
    assert out.scheduled[0].samples and not out.scheduled[1].samples


def test_no_chunking_waits_for_budget() -> None:
    sched = make_scheduler(budget=10, chunked=False)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        sched.add(seq("long", 11))
    sched.add(seq("a", 6))
    sched.add(seq("b", 6))
    out = sched.schedule()
    assert [s.seq.request_id for s in out.scheduled] == ["a"]


def test_preemption_newest_first_and_recompute() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, budget=64, caching=False)
    old, new = seq("old", 7, max_tokens=8), seq("new", 7, max_tokens=8)
    sched.add(old)
    sched.add(new)
    rng = random.Random(0)
    everyone = [old, new]
    preempted_names = []
    while sched.has_unfinished():
        out = sched.schedule()
        preempted_names += [p.request_id for p in out.preempted]
        sched.postprocess(out, [rng.randint(1, 60) if s.samples else None for s in out.scheduled])
        check(sched, everyone)
    assert preempted_names and preempted_names[0] == "new"
    assert old.num_completion_tokens == 8 and new.num_completion_tokens == 8
    assert sched.block_manager.num_free_blocks == 4


def test_abort_frees_blocks_immediately() -> None:
    sched = make_scheduler()
    a = seq("a", 9)
    sched.add(a)
    sched.postprocess(sched.schedule(), [3])
    assert sched.block_manager.num_used_blocks > 0
    assert sched.abort("a") is a
    assert a.finish_reason == "abort" and sched.block_manager.num_used_blocks == 0
    assert sched.abort("missing") is None


def test_eos_and_stop_tokens_finish() -> None:
    sched = make_scheduler()
    a = Sequence("a", [1, 2], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[42]))
    b = Sequence("b", [1, 2], SamplingParams(temperature=0, max_tokens=10))
    c = Sequence("c", [1, 2], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    for s in (a, b, c):
        sched.add(s)
    finished = sched.postprocess(sched.schedule(), [42, EOS, EOS])
    assert [s.request_id for s in finished] == ["a", "b"]
    assert a.finish_reason == b.finish_reason == "stop" and not c.is_finished


def test_prefix_hits_across_requests() -> None:
    sched = make_scheduler(block_size=4, budget=64)
    first = seq("first", 13)
    sched.add(first)
    sched.postprocess(sched.schedule(), [9])
    second = seq("second", 13)
    sched.add(second)
    out = sched.schedule()
    assert second.num_cached_tokens == 12
    assert [s.num_new_tokens for s in out.scheduled] == [1, 1]


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "step", "step", "step", "abort"]),
        st.integers(1, 40),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=50,
)


@settings(max_examples=120, deadline=None)
@given(
    actions=ACTIONS,
    num_blocks=st.integers(4, 24),
    block_size=st.sampled_from([1, 2, 4, 16]),
    budget=st.integers(1, 48),
    max_num_seqs=st.integers(1, 5),
    caching=st.booleans(),
    chunked=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_random_workload_never_leaks(
    actions, num_blocks, block_size, budget, max_num_seqs, caching, chunked, seed
) -> None:
    sched = make_scheduler(num_blocks, block_size, max_num_seqs, budget, chunked=chunked, caching=caching)
    rng = random.Random(seed)
    everyone: list[Sequence] = []
    prefix = [rng.randint(1, 60) for _ in range(24)]
    for i, (action, length, variant) in enumerate(actions):
        if action == "add":
            length = min(length, num_blocks * block_size // 2)
            if not chunked:
                length = min(length, budget)
            tokens = (prefix if variant % 2 else [])[:length] + [rng.randint(1, 60) for _ in range(length)]
            tokens = tokens[:length]
            s = Sequence(f"r{i}", tokens, SamplingParams(temperature=0, max_tokens=1 + variant * 8))
            sched.add(s)
            everyone.append(s)
        elif action == "step":
            run_step(sched, rng)
        elif everyone:
            sched.abort(everyone[variant % len(everyone)].request_id)
        check(sched, everyone)
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        run_step(sched, rng)
        check(sched, everyone)
    assert not sched.has_unfinished(), "requests starved"
    event(f"preempted={sched.num_preemptions > 0}")
    assert sched.block_manager.num_free_blocks == num_blocks
    for s in everyone:
        assert s.is_finished
        if s.finish_reason == "length":
            assert s.num_completion_tokens == s.params.max_tokens or len(s) == sched.max_model_len


def test_watermark_keeps_blocks_free_beside_running_sequences() -> None:
    sched = make_scheduler(num_blocks=200, block_size=1, max_num_seqs=8, budget=400, caching=False)
    assert sched.watermark_blocks == 2
    first = seq("first", 190)
    sched.add(first)
    sched.postprocess(sched.schedule(), [5])  # 190 blocks used, 10 free
    assert sched.block_manager.num_free_blocks == 10
    sched.add(seq("too-big", 8))  # 1 decode block for "first" + 8 would leave 1 < watermark
    out = sched.schedule()
    assert [s.seq.request_id for s in out.scheduled] == ["first"]
    sched.postprocess(out, [6])
    sched.abort("too-big")
    sched.add(seq("fits", 6))  # leaves 2 blocks free after first's next decode block
    out = sched.schedule()
    assert [s.seq.request_id for s in out.scheduled] == ["first", "fits"]


def test_preempted_sequence_longer_than_budget_recomputes_in_chunks() -> None:
    # Chunking off; a sequence preempted after outgrowing the token budget must still finish.
    sched = make_scheduler(num_blocks=8, block_size=2, max_num_seqs=2, budget=8, chunked=False, caching=False)
    a, b = seq("a", 2, max_tokens=9), seq("b", 6, max_tokens=9)
    sched.add(a)
    sched.add(b)
    rng = random.Random(1)
    preempted_lens = []
    for _ in range(500):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        preempted_lens += [len(p) for p in out.preempted]
        sched.postprocess(out, [rng.randint(1, 60) if s.samples else None for s in out.scheduled])
        check(sched, [a, b])
    assert any(n > 8 for n in preempted_lens), preempted_lens
    assert not sched.has_unfinished(), "the preempted sequence starved"
    assert a.num_completion_tokens == 9 and b.num_completion_tokens == 9
