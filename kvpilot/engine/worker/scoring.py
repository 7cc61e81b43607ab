"""Teacher-forced scoring through the serving path: the paged cache, its dtype, eviction, state pool.

`ModelRunner.score()` runs the model densely (no cache), which is exact but blind to approximations
that live in the cache (8-bit K/V, eviction, a recurrent summary). `score_paged` feeds the text
through the same kernels as serving, in chunks of `chunk` tokens (default: one block), with the
evictor applied after each chunk exactly as after a step. A token's log-probability then comes
from the view a served decode at that position would have had (to within one chunk).
`scores_through_cache` says when the engine must score this way (`LLMEngine.score` asks it).
"""

from __future__ import annotations

from typing import Any

import torch

from kvpilot.engine.context import reset_context, set_context
from kvpilot.engine.core.pools import BlockManagerLike
from kvpilot.engine.core.scheduler import ScheduledSeq, SchedulerOutput
from kvpilot.engine.core.sequence import Sequence, SequenceStatus
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.worker.sampler import TopLogprobs, token_logprobs

_SCORE_ID = "__kvpilot_score__"


def scores_through_cache(runner: Any, evictor: Any) -> bool:
    """Whether what serving computes differs from the dense computation, so scoring must take the
    paged path: a KV cache in another dtype than the model's (int8, fp8, auto switching, a 16-bit
    cache under an fp32 model), eviction, or a recurrent state (linear attention, MiniMax)."""
    layout = runner.kv_layout
    return (
        evictor is not None
        or runner.linear_state is not None
        or layout.kind == "auto-switch"
        or layout.dtype != runner.dtype
    )


@torch.inference_mode()
def score_paged(
    runner: Any,
    block_manager: BlockManagerLike,
    evictor: Any,
    prompt_token_ids: list[int],
    continuation_token_ids: list[int],
    chunk: int | None = None,
    top: int = 0,
) -> tuple[list[float], list[TopLogprobs]]:
    """log p(continuation[i] | prompt + continuation[:i]) computed through the paged serving path
    of this ModelRunner and block manager, with `evictor` (or None) applied after each chunk; and
    each position's `top` most likely tokens."""
    tokens = list(prompt_token_ids) + list(continuation_token_ids)
    bm = block_manager
    chunk = chunk or bm.block_size
    seq = Sequence(_SCORE_ID, tokens, SamplingParams(max_tokens=1))
    seq.status = SequenceStatus.RUNNING
    first = len(prompt_token_ids) - 1  # the row whose logits predict continuation[0]
    logprobs: list[float] = []
    tops: list[TopLogprobs] = []
    try:
        while seq.num_computed_tokens < len(tokens):
            n = min(chunk, len(tokens) - seq.num_computed_tokens)
            if not bm.can_append(seq, n):
                raise RuntimeError(
                    f"scoring needs {bm.blocks_for(n)} more free KV blocks, {bm.num_free_blocks} are free; "
                    "retry when fewer requests are running"
                )
            bm.may_append(seq, n)
            out = SchedulerOutput([ScheduledSeq(seq, n)])
            ctx, ids, positions, _ = runner._prepare(out)
            if runner.linear_state is not None:
                runner.linear_state.attach(ctx, out)
            set_context(ctx)
            try:
                hidden = runner.model(ids, positions)
            finally:
                reset_context()
            start = seq.num_computed_tokens
            lo, hi = max(first, start), min(start + n, len(tokens) - 1)
            if hi > lo:
                logits = runner.model.compute_logits(hidden[lo - start : hi - start]).float()
                target = torch.tensor(tokens[lo + 1 : hi + 1], dtype=torch.long, device=logits.device)
                chosen, alternatives = token_logprobs(logits, target, top)
                logprobs += chosen
                tops += alternatives
            seq.num_computed_tokens += n
            if evictor is not None:
                evictor.evict(seq)
    finally:
        bm.deallocate(seq)
        runner.release(_SCORE_ID)
    return logprobs, tops
