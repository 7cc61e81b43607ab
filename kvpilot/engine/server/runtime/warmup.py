"""Start-up warm-up: run real work through the engine before /ready turns true, so the first
client does not pay for lazy initialisation, kernel compilation or (on a GPU) Triton autotuning."""

from __future__ import annotations

import logging
import time

from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.server.runtime.engine_handle import EngineHandle
from kvpilot.engine.server.runtime.server_runtime import engine_max_model_len

log = logging.getLogger("kvpilot.server")

WARMUP_TEXT = "kvpilot warm-up: the quick brown fox jumps over the lazy dog."
WARMUP_MAX_STEPS = 10_000


def warm_up(engine: EngineHandle, *, max_tokens: int = 4) -> dict[str, float]:
    """Greedy generations at a short and a longer prompt (so prefill and decode both compile at
    two shapes), batched together; then the short one alone (a step of one decoding sequence has
    its own kernels: kernels/gemv_norm, EngineConfig.fused_gemv_rows); then one score() call.
    Returns seconds per phase."""
    tokenizer = engine.tokenizer
    max_len = engine_max_model_len(engine)
    base = list(tokenizer.encode(WARMUP_TEXT)) or [0]
    long_len = max(1, min(len(base) * 4, max_len // 2))
    prompts = [base[: max(1, min(len(base), max_len - max_tokens - 1))], (base * 8)[:long_len]]
    params = SamplingParams(temperature=0.0, max_tokens=max(1, min(max_tokens, max_len - long_len - 1)))
    timings: dict[str, float] = {}

    started = time.monotonic()
    steps = _generate(engine, prompts, params)
    timings["generate_seconds"] = time.monotonic() - started

    started = time.monotonic()
    steps += _generate(engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    timings["alone_seconds"] = time.monotonic() - started

    started = time.monotonic()
    engine.score(prompts[0], prompts[0][: min(4, len(prompts[0]))])
    timings["score_seconds"] = time.monotonic() - started
    log.info("warm-up done in %d steps: %s", steps, {k: round(v, 3) for k, v in timings.items()})
    return timings


def _generate(engine: EngineHandle, prompts: list[list[int]], params: SamplingParams) -> int:
    """Run `prompts` together to the end; the steps it took (aborted and refused past WARMUP_MAX_STEPS)."""
    ids = [f"warmup-{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, prompt, params)
    pending, steps = set(ids), 0
    while pending and steps < WARMUP_MAX_STEPS:
        for output in engine.step():
            if output.finished:
                pending.discard(output.request_id)
        steps += 1
    if pending:
        for request_id in pending:
            engine.abort_request(request_id)
        raise RuntimeError(f"warm-up did not finish within {WARMUP_MAX_STEPS} engine steps")
    return steps
