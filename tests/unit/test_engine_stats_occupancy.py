"""kv_occupancy (per-sequence set operations) equals the per-block walk it replaced, shared blocks,
partial tails, evicted views and over-long tables included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.metrics.stats import kv_occupancy
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


def per_block(running: list[Sequence], block_size: int) -> tuple[int, int]:
    filled: dict[int, int] = {}
    for seq in running:
        computed = seq.num_computed_tokens - seq.num_evicted_tokens
        for i, block_id in enumerate(seq.block_table):
            n = min(max(computed - i * block_size, 0), block_size)
            filled[block_id] = max(filled.get(block_id, 0), n)
    return sum(filled.values()), len(filled) * block_size


seq_spec = st.tuples(
    st.lists(st.integers(0, 12), max_size=8),  # block ids: small range, so sequences share blocks
    st.integers(0, 60),  # computed tokens
    st.integers(0, 3),  # evicted blocks
)


@settings(max_examples=300, deadline=None)
@given(st.lists(seq_spec, max_size=6), st.sampled_from([1, 4, 16]))
def test_matches_the_per_block_walk(specs: list[tuple[list[int], int, int]], block_size: int) -> None:
    running = []
    for i, (table, computed, evicted_blocks) in enumerate(specs):
        seq = Sequence(f"s{i}", [1] * max(computed, 1), SamplingParams())
        seq.block_table = table
        seq.num_computed_tokens = computed
        seq.num_evicted_tokens = min(evicted_blocks * block_size, computed)
        running.append(seq)
    assert kv_occupancy(running, block_size) == per_block(running, block_size)
