"""The kvpilot stats feed -> readings: every field lands under its schema name with the feed's value."""

from __future__ import annotations

import copy
import math

import pytest

from kvpilot.engine.metrics import stats_contract as contract
from kvpilot.sidecar.feed import FeedError, feed_readings
from kvpilot.sidecar.readings import HistogramValue
from tests.harness.stats_feed import make_feed

pytestmark = pytest.mark.unit


def test_every_scalar_field_lands_under_its_schema_name():
    r = feed_readings(make_feed()).samples
    assert r["kvpilot_kv_cache_efficiency"] == {(): 600 / 640}
    assert r["kvpilot_summary_cache_hit_rate"] == {(): 0.995}
    assert r["kvpilot_summary_cache_hits_total"] == {(): 995}
    assert r["kvpilot_summary_cache_misses_total"] == {(): 5}
    assert r["kvpilot_kv_cache_usage_ratio"] == {(): 40 / 200}
    assert r["kvpilot_kv_blocks_free"] == {(): 150}
    assert r["kvpilot_kv_blocks_cached"] == {(): 10}
    assert r["kvpilot_memory_kv_pool_bytes"] == {(): 13_107_200}
    assert r["kvpilot_memory_torch_allocated_bytes"] == {(): 15_000_000}
    assert r["kvpilot_prefix_cache_hit_tokens_total"] == {(): 250}
    assert r["kvpilot_requests_waiting"] == {(): 2}
    assert r["kvpilot_max_concurrency"] == {(): 32}
    assert r["kvpilot_engine_ready"] == {(): 1.0}
    assert r["kvpilot_validation_cosine"] == {(): 0.97}
    assert r["kvpilot_engine_info"] == {("engine-a", "tiny-llama", "gqa", "cpu", "bf16"): 1.0}


def test_labelled_fields_keep_their_keys_and_documented_reasons_start_at_zero():
    r = feed_readings(make_feed()).samples
    assert r["kvpilot_gqa_head_utilization"] == {("0", "0"): 0.25, ("0", "1"): 0.5, ("3", "1"): 0.125}
    rejected = r["kvpilot_requests_rejected_total"]
    assert rejected[("too_long",)] == 4 and rejected[("queue_full",)] == 1
    assert {k for (k,) in rejected} == set(contract.REJECT_REASONS)
    fallbacks = r["kvpilot_fallbacks_total"]  # by (strategy, reason); the engine starts each at 0
    assert fallbacks == {("kv_int8", "low_cosine"): 2, ("kv_int8", "kernel_error"): 0, ("kv_int8", "nan"): 0}
    assert r["kvpilot_validation_unrecovered_total"] == {("mla",): 1}
    assert r["kvpilot_fallback_reserve_blocks"] == {(): 24} and r["kvpilot_fallback_reserve_used_blocks"] == {(): 3}
    assert r["kvpilot_fallback_reserve_full_total"] == {(): 1}
    failed = r["kvpilot_requests_failed_total"]
    assert failed[("fault",)] == 3 and failed[("engine_error",)] == 1 and failed[("shutdown",)] == 0
    assert {k for (k,) in failed} == set(contract.FAILURE_REASONS)


def test_histograms_use_the_contract_bounds_and_keep_counts_and_sum():
    r = feed_readings(make_feed()).samples
    ttft = r["kvpilot_ttft_seconds"][()]
    assert isinstance(ttft, HistogramValue)
    assert [b for b, _ in ttft.buckets] == [*contract.LATENCY_BUCKETS_SECONDS, math.inf]
    le = dict(ttft.buckets)
    assert le[0.005] == 1 and le[0.025] == 3 and le[0.3] == 4 and le[3.0] == 5 and le[60.0] == 5
    assert ttft.count == 6 and ttft.sum == pytest.approx(0.004 + 0.02 + 0.02 + 0.3 + 2.5 + 100.0)


def test_values_that_do_not_apply_yet_are_left_out_not_zero():
    feed = make_feed(kv={"efficiency": None}, validation={"last_cosine": None},
                     linear={"summary_hits_total": 0, "summary_misses_total": 0},
                     gqa_head_utilization=[])
    r = feed_readings(feed)
    for name in ("kvpilot_kv_cache_efficiency", "kvpilot_validation_cosine",
                 "kvpilot_summary_cache_hit_rate", "kvpilot_gqa_head_utilization"):
        assert name not in r, name
    assert r.samples["kvpilot_summary_cache_misses_total"] == {(): 0}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f: f.update(schema_version=2), "schema_version is 2"),
        (lambda f: f["engine"].pop("instance_id"), "instance_id"),
        (lambda f: f["latency"]["ttft_seconds"]["buckets"].pop(), "buckets"),
        (lambda f: f["latency"]["tpot_seconds"]["buckets"].reverse(), "cumulative"),
    ],
)
def test_a_feed_the_sidecar_cannot_read_is_an_error_that_says_why(mutate, message):
    feed = copy.deepcopy(make_feed())
    mutate(feed)
    with pytest.raises((FeedError, ValueError), match=message):
        readings = feed_readings(feed)
        # Bucket order is checked when families are built; build them to reach that check.
        from kvpilot.sidecar.readings import build_families
        from kvpilot.sidecar.schema import ENGINE_DERIVED
        list(build_families(readings, ENGINE_DERIVED))
