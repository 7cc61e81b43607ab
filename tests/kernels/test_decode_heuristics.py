"""The split heuristic for paged decode (pure function, no kernel)."""

from __future__ import annotations

import pytest

from kvpilot.engine.kernels.paged_decode.heuristics import MAX_SPLITS, MIN_TOKENS_PER_SPLIT, choose_num_splits

pytestmark = pytest.mark.unit


def test_short_context_is_never_split() -> None:
    assert choose_num_splits(batch=1, num_kv_heads=1, max_context=MIN_TOKENS_PER_SPLIT, num_sms=132) == 1


def test_full_gpu_is_not_split() -> None:
    assert choose_num_splits(batch=256, num_kv_heads=8, max_context=32768, num_sms=132) == 1


def test_small_batch_long_context_is_split_within_bounds() -> None:
    splits = choose_num_splits(batch=1, num_kv_heads=8, max_context=131072, num_sms=132)
    assert 1 < splits <= MAX_SPLITS


def test_each_split_keeps_a_minimum_length() -> None:
    splits = choose_num_splits(batch=1, num_kv_heads=1, max_context=4 * MIN_TOKENS_PER_SPLIT, num_sms=132)
    assert splits == 4
