"""Eviction policies (sinks, ladder) and BlockManager invariants while blocks are evicted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.strategies.eviction.policy import EvictionPolicy, Evictor
from tests.unit.test_block_manager import check_invariants

pytestmark = pytest.mark.unit


def test_sinks_keep_first_and_newest_blocks() -> None:
    policy = EvictionPolicy("sinks", sink_blocks=1, window_blocks=3, span_blocks=3)
    assert policy.kept(4) == [0, 1, 2, 3]
    assert policy.kept(10) == [0, 7, 8, 9]


def test_ladder_thins_older_spans_more() -> None:
    policy = EvictionPolicy("ladder", sink_blocks=1, window_blocks=2, span_blocks=4)
    kept = policy.kept(40)  # window 38-39; level 1 (every 2nd): 34-37; level 2 (every 4th): 30-33; ...
    assert kept[-2:] == [38, 39]
    assert [j for j in kept if 34 <= j <= 37] == [34, 36]
    assert [j for j in kept if 30 <= j <= 33] == [32]
    assert [j for j in kept if 26 <= j <= 29] == []  # every 8th: none in 26..29
    assert kept[0] == 0  # the sink


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(["sinks", "ladder"]),
    sinks=st.integers(0, 3),
    window=st.integers(1, 6),
    span=st.integers(1, 6),
    length=st.integers(0, 400),
)
def test_kept_sets_only_shrink_and_stay_bounded(mode, sinks, window, span, length) -> None:
    policy = EvictionPolicy(mode, sinks, window, span)
    before, after = set(policy.kept(length)), set(policy.kept(length + 1))
    assert after - {length} <= before  # a dropped block never comes back
    assert len(after) <= policy.max_resident_blocks((length + 1) * 16, 16)


def test_token_counts_round_up_to_blocks() -> None:
    policy = EvictionPolicy.from_tokens("sinks", sinks=4, window=33, span=None, block_size=16)
    assert (policy.sink_blocks, policy.window_blocks, policy.span_blocks) == (1, 3, 3)


def test_bad_settings_say_what_is_allowed(tmp_path) -> None:
    with pytest.raises(ValueError, match="eviction must be one of"):
        EngineConfig(model=str(tmp_path), eviction="lru")
    with pytest.raises(ValueError, match="eviction_window"):
        EngineConfig(model=str(tmp_path), eviction="sinks", eviction_window=0)
    with pytest.raises(ValueError, match="chunked prefill"):
        EngineConfig(model=str(tmp_path), eviction="sinks", enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="validation_sample_rate"):
        EngineConfig(model=str(tmp_path), validation_sample_rate=1.5)


def test_evicted_blocks_are_freed_and_tokens_keep_their_slots() -> None:
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    evictor = Evictor(EvictionPolicy("sinks", 1, 2, 2), bm)
    seq = Sequence("a", list(range(30)), SamplingParams())
    bm.allocate(seq, 30, [])
    seq.num_computed_tokens = 30
    bm.commit(seq)
    table = list(seq.block_table)
    assert evictor.evict(seq) == 4  # 7 full blocks: keep block 0 and blocks 5, 6 (+ the partial tail 7)
    assert seq.block_table == [table[0], table[5], table[6], table[7]]
    assert seq.num_evicted_tokens == 16 and bm.num_free_blocks == 6
    assert evictor.table_logical_blocks(seq) == [0, 5, 6, 7]
    bm.deallocate(seq)
    assert bm.num_free_blocks == 10 and seq.num_evicted_tokens == 0


OPS = st.lists(
    st.tuples(st.sampled_from(["add", "step", "free"]), st.integers(0, 7), st.integers(1, 40)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    ops=OPS,
    block_size=st.sampled_from([1, 2, 4]),
    caching=st.booleans(),
    mode=st.sampled_from(["sinks", "ladder"]),
    window=st.integers(1, 4),
)
def test_random_operations_with_eviction_keep_invariants(ops, block_size, caching, mode, window) -> None:
    bm = BlockManager(num_blocks=16, block_size=block_size, enable_prefix_caching=caching)
    evictor = Evictor(EvictionPolicy(mode, 1, window, 2), bm)
    live: list[Sequence] = []
    prefixes = [[7] * 9, list(range(20)), [3, 1, 4, 1, 5, 9, 2, 6]]
    for i, (op, pick, n) in enumerate(ops):
        if op == "add":
            seq = Sequence(f"s{i}", (prefixes[pick % 3] + [pick] * n)[: n + 4], SamplingParams())
            hits = bm.match_prefix(seq)
            first = min(len(seq) - len(hits) * block_size, n)
            if bm.can_allocate(seq, first, hits):
                bm.allocate(seq, first, hits)
                seq.num_computed_tokens += first
                bm.commit(seq)
                evictor.evict(seq)
                live.append(seq)
        elif op == "step" and live:
            seq = live[pick % len(live)]
            if seq.num_uncomputed_tokens == 0:
                seq.append_token(pick)
            k = min(seq.num_uncomputed_tokens, n)
            if bm.can_append(seq, k):
                bm.may_append(seq, k)
                seq.num_computed_tokens += k
                bm.commit(seq)
                evictor.evict(seq)
        elif op == "free" and live:
            bm.deallocate(live.pop(pick % len(live)))
        check_invariants(bm, live)
        for seq in live:  # the table holds exactly the resident view: kept full blocks + the tail
            resident = seq.num_computed_tokens - seq.num_evicted_tokens
            assert len(seq.block_table) == bm.blocks_for(resident)
    for seq in live:
        bm.deallocate(seq)
    check_invariants(bm, [])
    assert bm.num_free_blocks == bm.num_blocks
