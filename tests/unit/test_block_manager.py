"""BlockManager invariants: no leak, no double free, ref counts, prefix hits, cached reuse."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.engine.core.block_manager import NO_HASH, BlockManager
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


def make_seq(name: str, tokens: list[int]) -> Sequence:
    return Sequence(name, tokens, SamplingParams(temperature=0.0))


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    assert set(bm.free_block_ids).isdisjoint(bm.used_block_ids)
    holders: dict[int, int] = {}
    for seq in live:
        assert len(set(seq.block_table)) == len(seq.block_table), "a sequence holds a block twice"
        for b in seq.block_table:
            holders[b] = holders.get(b, 0) + 1
    for block in bm.blocks:
        assert block.ref_count == holders.get(block.block_id, 0)
        assert (block.ref_count > 0) == (block.block_id in bm.used_block_ids)
    assert bm.num_cached_free_blocks == sum(1 for b in bm.free_block_ids if bm.blocks[b].hash != NO_HASH)
    for h, block_id in bm.hash_to_block_id.items():
        assert bm.blocks[block_id].hash == h


def compute_all(bm: BlockManager, seq: Sequence, n: int) -> None:
    """Pretend the model computed the next n tokens of seq."""
    bm.may_append(seq, n)
    seq.num_computed_tokens += n
    bm.commit(seq)


def test_imports_no_torch() -> None:
    code = (
        "import sys; import kvpilot.engine.core.block_manager, kvpilot.engine.core.scheduler, "
        "kvpilot.engine.core.sequence, kvpilot.engine.sampling_params; "
        "bad = [m for m in ('torch', 'triton', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prefix_hit_on_shared_full_blocks() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    shared = list(range(100, 110))  # 2 full blocks + 2 tokens
    a = make_seq("a", [*shared, 1, 2])
    bm.allocate(a, len(a))
    a.num_computed_tokens = len(a)
    bm.commit(a)
    b = make_seq("b", [*shared, 7, 8, 9])
    hits = bm.match_prefix(b)
    assert [h[0] for h in hits] == a.block_table[:2]
    bm.allocate(b, len(b) - 8, hits)
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    assert bm.prefix_hit_tokens == 8 and bm.prefix_queried_tokens == len(a) + len(b)
    check_invariants(bm, [a, b])


def test_last_token_is_never_a_hit() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq("a", list(range(8)))
    bm.allocate(a, 8)
    a.num_computed_tokens = 8
    bm.commit(a)
    b = make_seq("b", list(range(8)))
    assert len(bm.match_prefix(b)) == 1  # the second block holds the last token: recomputed


def test_uncomputed_blocks_are_not_hits() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq("a", list(range(12)))
    bm.allocate(a, 12)  # slots reserved, nothing computed yet
    assert bm.match_prefix(make_seq("b", list(range(12)))) == []


def test_cached_blocks_reusable_after_free_and_evicted_lru() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq("a", [1, 2, 3, 4, 5])
    bm.allocate(a, 5)
    a.num_computed_tokens = 5
    bm.commit(a)
    held = list(a.block_table)
    bm.deallocate(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_free_blocks == 2
    b = make_seq("b", [1, 2, 3, 4, 9])
    hits = bm.match_prefix(b)
    assert [h[0] for h in hits] == held[:2]
    bm.allocate(b, 1, hits)
    assert b.num_cached_tokens == 4
    check_invariants(bm, [b])
    bm.deallocate(b)
    # Fill the pool with unrelated tokens: the cached blocks get evicted, not shared.
    c = make_seq("c", [50, 51, 52, 53, 54, 55, 56, 57])
    bm.allocate(c, 8)
    assert bm.hash_to_block_id == {}
    assert all(bm.blocks[x].hash == NO_HASH for x in c.block_table)
    check_invariants(bm, [c])


def test_content_check_rejects_hash_collision() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq("a", [1, 2, 3])
    bm.allocate(a, 3)
    a.num_computed_tokens = 3
    bm.commit(a)
    block = bm.blocks[a.block_table[0]]
    block.token_ids = (9, 9)  # simulate a colliding entry with other content
    assert bm.match_prefix(make_seq("b", [1, 2, 3])) == []


def test_can_append_counts_free_blocks() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    a = make_seq("a", [1, 2, 3, 4])
    bm.allocate(a, 4)
    a.num_computed_tokens = 4
    assert bm.can_append(a, 4) and not bm.can_append(a, 5)


OPS = st.lists(
    st.tuples(st.sampled_from(["add", "step", "free"]), st.integers(0, 7), st.integers(1, 40)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, block_size=st.sampled_from([1, 2, 4, 16]), caching=st.booleans())
def test_random_operations_keep_invariants(ops, block_size: int, caching: bool) -> None:
    bm = BlockManager(num_blocks=12, block_size=block_size, enable_prefix_caching=caching)
    live: list[Sequence] = []
    prefixes = [[7] * 9, list(range(20)), [3, 1, 4, 1, 5, 9, 2, 6]]
    for i, (op, pick, n) in enumerate(ops):
        if op == "add":
            seq = make_seq(f"s{i}", (prefixes[pick % 3] + [pick] * n)[: n + 4])
            hits = bm.match_prefix(seq)
            first = min(len(seq) - len(hits) * block_size, n)
            if bm.can_allocate(seq, first, hits):
                bm.allocate(seq, first, hits)
                seq.num_computed_tokens += first
                bm.commit(seq)
                live.append(seq)
        elif op == "step" and live:
            seq = live[pick % len(live)]
            if seq.num_uncomputed_tokens == 0:
                seq.append_token(pick)
            k = min(seq.num_uncomputed_tokens, n)
            if bm.can_append(seq, k):
                compute_all(bm, seq, k)
        elif op == "free" and live:
            bm.deallocate(live.pop(pick % len(live)))
        check_invariants(bm, live)
    for seq in live:
        bm.deallocate(seq)
    check_invariants(bm, [])
    assert bm.num_free_blocks == bm.num_blocks
