"""How many paged blocks a sequence keeps resident under KV eviction (the engine's EvictionPolicy uses this bound).

`sinks` keeps the first `sink_blocks` and the last `window_blocks` full blocks; `ladder` also keeps every
2^level-th block of each older span of `span_blocks` (docs/long_context.md, "Eviction"). Token counts round
up to whole blocks, as the engine rounds them.
"""

from __future__ import annotations

import math

from kvpilot.planner.errors import PlannerError
from kvpilot.strategy_schema import EVICTION_MODES


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def max_resident_blocks(mode: str, sink_blocks: int, window_blocks: int, span_blocks: int, max_len_tokens: int,
                        block_size: int) -> int:
    """An upper bound on the full blocks one sequence keeps, at any length up to max_len_tokens."""
    if mode == "none":
        return blocks_for(max_len_tokens, block_size)
    bound = sink_blocks + window_blocks
    if mode == "ladder":  # span/2 + span/4 + ... plus one rounding per level up to log2
        bound += span_blocks + int(math.log2(max(2, max_len_tokens // block_size))) + 1
    return bound


def resident_blocks(mode: str, sinks: int, window: int, span: int | None, max_len_tokens: int, block_size: int) -> int:
    """Blocks one sequence of up to max_len_tokens holds at once (token counts): its resident full blocks and
    the block being filled, never more than the whole sequence's."""
    if mode not in EVICTION_MODES:
        raise PlannerError(f"eviction {mode!r} is not supported; choose one of {', '.join(EVICTION_MODES)}")
    if sinks < 0 or window < 1 or (span is not None and span < 1):
        raise PlannerError(
            f"eviction needs eviction_sinks >= 0, eviction_window >= 1 and eviction_ladder_span >= 1 tokens; got "
            f"{sinks}, {window}, {span}"
        )
    full = blocks_for(max_len_tokens, block_size)
    if mode == "none":
        return full
    window_blocks = blocks_for(window, block_size)
    span_blocks = blocks_for(span, block_size) if span else window_blocks
    kept = max_resident_blocks(mode, blocks_for(sinks, block_size), window_blocks, span_blocks, max_len_tokens,
                               block_size)
    return min(full, kept + 1)
