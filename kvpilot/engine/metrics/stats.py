"""Counters and histograms behind LLMEngine.stats(); assembles the feed of stats_contract."""

from __future__ import annotations

import time
import uuid
from typing import Any, Unpack

from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.scheduler import Scheduler
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.metrics.kv_time import KvOccupancyIntegral
from kvpilot.engine.metrics.stats_contract import (
    IDLE_LINEAR,
    IDLE_MLA,
    REJECT_REASONS,
    SCHEMA_VERSION,
    VLLM_BUCKETS_SECONDS,
    FeedSections,
    Histogram,
    idle_validation,
)


class EngineStats:
    """Cumulative request counters and latency histograms since the engine started."""

    def __init__(self) -> None:
        self.instance_id = uuid.uuid4().hex
        self.start_time_seconds = time.time()
        self.finished_total = 0
        self.aborted_total = 0
        self.rejected_total: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.oom_events_total = 0
        self.ttft = Histogram()
        self.tpot = Histogram()
        self.e2e = Histogram()
        # The same observations on vLLM's bounds (inter-token: every gap), for the vllm: names.
        self.vllm = {key: Histogram(bounds) for key, bounds in VLLM_BUCKETS_SECONDS.items()}
        self.finished_by_reason: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.kv_time = KvOccupancyIntegral(time.monotonic())  # token-slot-seconds (kv_time.py says why)

    def record_rejection(self, reason: str) -> None:
        self.rejected_total[reason] = self.rejected_total.get(reason, 0) + 1

    def on_token(self, seq: Sequence, now: float) -> None:
        self.generation_tokens_total += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.ttft.observe(now - seq.arrival_time)
            self.vllm["ttft_seconds"].observe(now - seq.arrival_time)
        elif seq.last_token_time is not None:
            self.vllm["inter_token_seconds"].observe(now - seq.last_token_time)
        seq.last_token_time = now

    def on_finish(self, seq: Sequence, now: float) -> None:
        reason = seq.finish_reason or "stop"
        self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1
        if reason == "abort":
            self.aborted_total += 1
            return
        self.finished_total += 1
        self.e2e.observe(now - seq.arrival_time)
        self.vllm["e2e_seconds"].observe(now - seq.arrival_time)
        if seq.first_token_time is not None and seq.num_completion_tokens > 1:
            self.tpot.observe((now - seq.first_token_time) / (seq.num_completion_tokens - 1))


def kv_occupancy(running: list[Sequence], block_size: int) -> tuple[int, int]:
    """(live token slots, allocated token slots) over the distinct blocks live sequences hold.

    A block shared by several sequences counts once, as filled as its fullest holder has it. Python
    work is per sequence, not per block (set operations do the rest): a scrape at batch 64 x 4k
    context would otherwise walk 16k blocks.
    """
    allocated: set[int] = set()
    full: set[int] = set()
    partial: dict[int, int] = {}  # the one partly filled block of each sequence
    for seq in running:
        table = seq.block_table
        computed = max(seq.num_computed_tokens - seq.num_evicted_tokens, 0)  # the table holds the resident view
        num_full = min(computed // block_size, len(table))
        allocated.update(table)
        full.update(table[:num_full])
        if num_full < len(table) and computed > num_full * block_size:
            block = table[num_full]
            partial[block] = max(partial.get(block, 0), computed - num_full * block_size)
    live = len(full) * block_size + sum(n for block, n in partial.items() if block not in full)
    return live, len(allocated) * block_size


def build_feed(
    stats: EngineStats,
    engine_info: dict[str, Any],
    block_manager: BlockManager,
    scheduler: Scheduler,
    bytes_per_block: int,
    memory: dict[str, int],
    **sections: Unpack[FeedSections],
) -> dict[str, Any]:
    """The whole stats feed, every key of stats_contract present, assembled once: each owner passes
    its typed section (stats_contract.FeedSections: KV dtypes and bytes, MLA, the linear state pool,
    validation, head utilisation); a section not passed gets its idle value."""
    sequences_by_dtype = sections.get("sequences_by_dtype")
    kv_used = sections.get("kv_used")
    running = list(scheduler.running)
    bm = block_manager
    live, allocated = kv_occupancy(running, bm.block_size)
    live_seconds, allocated_seconds = stats.kv_time.totals(time.monotonic())
    kv_extra = {} if sequences_by_dtype is None else {"sequences_by_dtype": sequences_by_dtype}
    return {
        "schema_version": SCHEMA_VERSION,
        "engine": {
            "instance_id": stats.instance_id,
            "start_time_seconds": stats.start_time_seconds,
            **engine_info,
            "mla": sections.get("mla", IDLE_MLA),
        },
        "kv": {
            "block_size": bm.block_size,
            "bytes_per_block": bytes_per_block,
            "blocks_total": bm.num_blocks,
            "blocks_free": bm.num_free_blocks,
            "blocks_used": bm.num_used_blocks,
            "blocks_cached": bm.num_cached_free_blocks,
            "live_token_slots": live,
            "allocated_token_slots": allocated,
            "efficiency": live / allocated if allocated else None,
            "live_token_seconds_total": live_seconds,
            "allocated_token_seconds_total": allocated_seconds,
            **kv_extra,
        },
        "prefix_cache": {
            "queried_tokens_total": bm.prefix_queried_tokens,
            "hit_tokens_total": bm.prefix_hit_tokens,
        },
        "memory_bytes": {**memory, "kv_used": bm.num_used_blocks * bytes_per_block if kv_used is None else kv_used},
        "requests": {
            "running": len(running),
            "waiting": len(scheduler.waiting),
            "finished_total": stats.finished_total,
            "aborted_total": stats.aborted_total,
            "rejected_total": dict(stats.rejected_total),
            "preemptions_total": scheduler.num_preemptions,
            "prompt_tokens_total": stats.prompt_tokens_total,
            "generation_tokens_total": stats.generation_tokens_total,
            "oom_events_total": stats.oom_events_total,
            "max_concurrency": scheduler.max_num_seqs,
        },
        "latency": {
            "ttft_seconds": stats.ttft.to_feed(),
            "tpot_seconds": stats.tpot.to_feed(),
            "e2e_seconds": stats.e2e.to_feed(),
        },
        "vllm": {**{key: hist.to_feed() for key, hist in stats.vllm.items()},
                 "finished_total": dict(stats.finished_by_reason)},
        "linear": sections.get("linear", IDLE_LINEAR),
        "gqa_head_utilization": sections.get("gqa_head_utilization", []),
        "validation": sections.get("validation") or idle_validation(),
    }
