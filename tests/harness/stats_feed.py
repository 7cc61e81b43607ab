"""A stats feed shaped exactly as kvpilot/engine/metrics/stats_contract.py documents, for sidecar tests."""

from __future__ import annotations

from typing import Any

from kvpilot.engine.metrics import stats_contract as contract


def make_feed(instance_id: str = "engine-a", **sections: Any) -> dict[str, Any]:
    """A feed shaped exactly as stats_contract documents, with distinct values everywhere."""
    ttft, tpot, e2e = contract.Histogram(), contract.Histogram(), contract.Histogram()
    for value in (0.004, 0.02, 0.02, 0.3, 2.5, 100.0):
        ttft.observe(value)
    for value in (0.01, 0.012, 0.05):
        tpot.observe(value)
    e2e.observe(1.2)
    vllm = {key: contract.Histogram(bounds) for key, bounds in contract.VLLM_BUCKETS_SECONDS.items()}
    for key, values in {"ttft_seconds": (0.004, 0.02, 0.02, 0.3, 2.5, 100.0),
                        "inter_token_seconds": (0.01, 0.012, 0.05, 0.3), "e2e_seconds": (1.2,)}.items():
        for value in values:
            vllm[key].observe(value)
    feed: dict[str, Any] = {
        "schema_version": contract.SCHEMA_VERSION,
        "taken_at_seconds": 1_700_000_100.0, "age_seconds": 0.25,
        "engine": {"instance_id": instance_id, "model": "tiny-llama", "strategy": "gqa",
                   "device": "cpu", "start_time_seconds": 1_700_000_000.5, "ready": True,
                   "kv_cache_dtype": "bf16"},
        "kv": {"block_size": 16, "bytes_per_block": 65536, "blocks_total": 200, "blocks_free": 150,
               "blocks_used": 40, "blocks_cached": 10, "live_token_slots": 600,
               "allocated_token_slots": 640, "efficiency": 600 / 640,
               "live_token_seconds_total": 90.5, "allocated_token_seconds_total": 120.25,
               "sequences_by_dtype": {"bfloat16": 2, "int8": 1}},
        "prefix_cache": {"queried_tokens_total": 1000, "hit_tokens_total": 250},
        "memory_bytes": {"weights": 1_000_000, "kv_pool": 13_107_200, "kv_used": 2_621_440,
                         "activation_peak": 500_000, "torch_reserved": 20_000_000,
                         "torch_allocated": 15_000_000},
        "requests": {"running": 3, "waiting": 2, "finished_total": 17, "aborted_total": 1,
                     "rejected_total": {"too_long": 4, "queue_full": 1}, "preemptions_total": 6,
                     "prompt_tokens_total": 2048, "generation_tokens_total": 4096,
                     "oom_events_total": 0, "max_concurrency": 32,
                     "failed_total": {"fault": 3, "engine_error": 1}},
        "latency": {"ttft_seconds": ttft.to_feed(), "tpot_seconds": tpot.to_feed(),
                    "e2e_seconds": e2e.to_feed()},
        "vllm": {**{key: hist.to_feed() for key, hist in vllm.items()},
                 "finished_total": {"stop": 12, "length": 5, "abort": 1}},
        "linear": {"summary_hits_total": 995, "summary_misses_total": 5},
        "gqa_head_utilization": [{"layer": 0, "kv_head": 0, "value": 0.25},
                                 {"layer": 0, "kv_head": 1, "value": 0.5},
                                 {"layer": 3, "kv_head": 1, "value": 0.125}],
        "validation": {"checks_total": 12,
                       "fallbacks_total": {"kv_int8": {"low_cosine": 2, "kernel_error": 0, "nan": 0}},
                       "unrecovered_total": {"mla": 1},
                       "last_cosine": 0.97, "checks_skipped_total": 1,
                       "reserve": {"blocks_total": 24, "blocks_used": 3, "sequences": 1, "full_total": 1}},
    }
    for key, value in sections.items():
        feed[key] = value if not isinstance(value, dict) else {**feed[key], **value}
    return feed
