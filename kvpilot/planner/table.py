"""The capacity plan as the table `kvpilot plan` and `kvpilot serve` print."""

from __future__ import annotations

from kvpilot.planner.capacity import CapacityPlan
from kvpilot.planner.units import human_bytes


def format_plan(plan: CapacityPlan) -> str:
    """A two-column table: the memory account, then the per-request peak and the limits."""
    hb = human_bytes
    rows = [
        ("strategy", plan.strategy),
        ("gpu", f"{plan.gpus} x {plan.gpu_product}"),
        ("total memory", hb(plan.total_memory_bytes)),
        ("- weights", hb(plan.weights_bytes)),
        ("- CUDA context", hb(plan.cuda_context_bytes)),
        ("- activation peak", hb(plan.activation_peak_bytes)),
        ("= free", hb(plan.free_bytes)),
        (f"KV pool ({plan.watermark:.0%} watermark)", hb(plan.kv_pool_bytes)),
        ("KV bytes per token", hb(plan.bytes_per_token)),
    ]
    if plan.fixed_bytes_per_sequence:
        rows.append(("fixed state per sequence", hb(plan.fixed_bytes_per_sequence)))
    if plan.reserve_bytes:
        rows.append(("- fallback reserve", f"{hb(plan.reserve_bytes)} ({plan.reserve_sequences} exact sequences)"))
    if plan.pool16_sequences or plan.pool8_sequences:
        rows.append(("auto pools (16-bit / int8)", f"{plan.pool16_sequences} / {plan.pool8_sequences} sequences"))
    rows += [
        ("block size (tokens)", str(plan.block_size)),
        ("blocks in pool", f"{plan.num_blocks} x {hb(plan.block_bytes)}"),
        ("max_seq_len", str(plan.max_seq_len)),
        ("per-request peak", f"{hb(plan.per_request_peak_bytes)} ({plan.blocks_per_request} blocks)"),
        ("max concurrency", str(plan.max_concurrency)),
        ("feasible", "yes" if plan.feasible else "NO"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append(plan.reason)
    return "\n".join(lines)
