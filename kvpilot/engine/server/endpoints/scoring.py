"""POST /v1/score: log-probabilities of a continuation's tokens given a prompt."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from kvpilot.engine.server.http.errors import APIError
from kvpilot.engine.server.runtime.admission import Admission
from kvpilot.engine.server.runtime.engine_loop import EngineLoop
from kvpilot.engine.server.runtime.server_runtime import ServerRuntime
from kvpilot.engine.server.wire.request_bodies import ScoreRequest
from kvpilot.engine.server.wire.response_bodies import ScoreResponse
from kvpilot.engine.server.wire.text_checks import check_unicode, prompt_chars

SCORE_TIMEOUT_SECONDS = 120.0


def continuation_ids(tokenizer: Any, text: str) -> list[int]:
    """The continuation's own tokens: no BOS, since it follows the prompt."""
    ids = list(tokenizer.encode(text))
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and ids and ids[0] == bos:
        ids = ids[1:]
    return ids


async def score(runtime: ServerRuntime, req: ScoreRequest) -> ScoreResponse:
    engine_loop, admission = runtime.require_ready()
    runtime.check_model(req.model)
    try:
        check_unicode(req)
    except APIError:
        runtime.record_rejection("invalid")
        raise
    admission.check_prompt_chars(prompt_chars(req), "continuation")
    admission.acquire_score()
    try:
        return await _score(runtime, engine_loop, admission, req)
    finally:
        admission.release_score()


def _encode_both(tokenizer: Any, req: ScoreRequest) -> tuple[list[int], list[int]]:
    return list(tokenizer.encode(req.prompt)), continuation_ids(tokenizer, req.continuation)


async def _score(runtime: ServerRuntime, engine_loop: EngineLoop, admission: Admission, req: ScoreRequest) -> ScoreResponse:
    tokenizer = runtime.tokenizer
    prompt_ids, cont_ids = await runtime.run_cpu(_encode_both, tokenizer, req)
    if not cont_ids:
        runtime.record_rejection("invalid")
        raise APIError(
            400, "the continuation encodes to no tokens; send some text to score", param="continuation"
        )
    total = len(prompt_ids) + len(cont_ids)
    if total > admission.max_model_len:
        runtime.record_rejection("too_long")
        raise APIError(
            400,
            f"the prompt has {len(prompt_ids)} tokens and the continuation {len(cont_ids)}: {total} tokens "
            f"exceed this model's maximum context length of {admission.max_model_len} tokens",
            param="continuation",
            code="context_length_exceeded",
        )
    # heavy: the engine thread runs at most one score between two steps, so streams keep flowing.
    future = engine_loop.call(lambda engine: engine.score(prompt_ids, cont_ids), heavy=True)
    try:
        logprobs = await asyncio.wait_for(asyncio.wrap_future(future), SCORE_TIMEOUT_SECONDS)
    except TimeoutError as exc:
        future.cancel()
        runtime.record_failure("timeout")
        raise APIError(503, "scoring timed out: the engine is busy; retry", code="timeout") from exc
    except Exception as exc:
        runtime.record_rejection("internal_error")
        runtime.record_failure("engine_error")
        raise APIError(500, f"internal error while scoring: {type(exc).__name__}: {exc}", code="internal_error") from exc
    values = [float(v) for v in logprobs]
    if len(values) != len(cont_ids) or not all(math.isfinite(v) for v in values):
        runtime.record_rejection("internal_error")
        runtime.record_failure("engine_error")
        raise APIError(500, f"the engine returned {len(values)} log-probabilities for {len(cont_ids)} tokens")
    return ScoreResponse(
        model=runtime.settings.model_name,
        prompt_tokens=len(prompt_ids),
        continuation_tokens=[tokenizer.decode([t]) for t in cont_ids],
        continuation_token_ids=cont_ids,
        token_logprobs=values,
        sum_logprob=math.fsum(values),
    )
