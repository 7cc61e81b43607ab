"""Shared by the CPU decode benches: requests admitted with their prompts already computed, timed steps.

Every timed step is then a pure decode step over a full batch, without paying for the prefill.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import torch

from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.sequence import SequenceStatus


def admit_computed(engine: LLMEngine, batch: int, context: int, max_tokens: int, fill_cache: bool = True) -> None:
    """`batch` running requests of `context` random prompt tokens with all but the last computed.

    fill_cache: the KV cache gets random rows (the computed tokens were never written) and, for a
    linear-attention engine, each summary is resident (a hit at the first decode step) with random
    positive values.
    """
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    scheduler, bm = engine.scheduler, engine.block_manager
    linear = engine.runner.linear_state if fill_cache else None
    for i in range(batch):
        prompt = [rng.randrange(3, vocab) for _ in range(context)]
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    while scheduler.waiting:
        seq = scheduler.waiting.popleft()
        bm.allocate(seq, len(seq), [])
        seq.num_computed_tokens = len(seq) - 1  # the first step computes the last prompt token and samples
        bm.commit(seq)
        seq.status = SequenceStatus.RUNNING
        scheduler.running.append(seq)
        if linear is not None:
            linear.pool.resolve(seq.request_id, 0)
            linear.pool.advance(seq.request_id, seq.num_computed_tokens)
    if fill_cache:
        torch.manual_seed(0)
        engine.runner.kv_cache.normal_()
        if linear is not None:
            for layer in linear.layers:
                layer.state_pool.uniform_(0.0, 1.0)


def time_steps(engine: LLMEngine, warmup: int, steps: int) -> dict[str, float]:
    """Median wall time of `steps` engine steps after `warmup`, and of the model forward inside them."""
    model = engine.runner.model
    forward, spent = model.forward, [0.0]

    def timed_forward(*args: Any) -> torch.Tensor:
        start = time.perf_counter()
        try:
            return forward(*args)
        finally:
            spent[0] += time.perf_counter() - start

    model.forward = timed_forward
    rows = []
    batch = engine.config.max_num_seqs
    try:
        for i in range(warmup + steps):
            spent[0] = 0.0
            start = time.perf_counter()
            outs = engine.step()
            total = time.perf_counter() - start
            if len(outs) != batch:
                raise RuntimeError(f"a step produced {len(outs)} outputs, expected one per sequence")
            if i >= warmup:
                rows.append((total * 1e3, spent[0] * 1e3))
    finally:
        model.forward = forward
    step_ms = statistics.median(r[0] for r in rows)
    return {"step_ms": step_ms, "forward_ms": statistics.median(r[1] for r in rows), "tok_s": batch / step_ms * 1e3}
