"""Serving one chat or text completion: admit it, run it once, answer every caller that asked."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.server.http.errors import STRATEGY_HEADER, APIError, error_response
from kvpilot.engine.server.runtime.admission import Admission
from kvpilot.engine.server.runtime.engine_loop import EngineLoop
from kvpilot.engine.server.runtime.generation import EngineFailure, Generation, TextDelta
from kvpilot.engine.server.runtime.grammar_admission import compile_constraint
from kvpilot.engine.server.runtime.idempotency import IDEMPOTENCY_HEADER, IdempotencyStore, body_fingerprint
from kvpilot.engine.server.runtime.result_log import ResultLog
from kvpilot.engine.server.runtime.server_runtime import ServerRuntime
from kvpilot.engine.server.tools.tool_calls import ToolPlan, ToolStream, tool_plan
from kvpilot.engine.server.wire.api_error import error_body
from kvpilot.engine.server.wire.completion_format import DONE_EVENT, CompletionFormat, sse
from kvpilot.engine.server.wire.logprobs import (
    TokenLogprobs,
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs,
)
from kvpilot.engine.server.wire.prompts import (
    MAX_PROMPTS_PER_REQUEST,
    chat_prompt_ids,
    completion_prompt_ids,
    echoed_texts,
    prompt_list,
    reject_unsupported,
    sampling_params,
)
from kvpilot.engine.server.wire.request_bodies import SEED_LIMIT, ChatCompletionRequest, CompletionRequest
from kvpilot.engine.server.wire.request_limits import check_request_limits
from kvpilot.engine.server.wire.response_bodies import Usage
from kvpilot.engine.server.wire.structured_request import structured_spec
from kvpilot.engine.server.wire.text_checks import check_unicode, prompt_chars
from kvpilot.engine.structured.spec import StructuredSpec

log = logging.getLogger("kvpilot.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def serve_completion(
    request: Request, runtime: ServerRuntime, req: ChatCompletionRequest | CompletionRequest
) -> Response:
    chat = isinstance(req, ChatCompletionRequest)
    engine_loop, admission = runtime.require_ready()
    runtime.check_model(req.model)
    try:
        reject_unsupported(req)
        check_unicode(req)
        check_request_limits(req)
    except APIError:
        runtime.record_rejection("invalid")
        raise
    admission.check_prompt_chars(prompt_chars(req), "messages" if chat else "prompt")
    key = request.headers.get(IDEMPOTENCY_HEADER)
    fingerprint = ""
    if key is not None:
        IdempotencyStore.check_key(key)
        fingerprint = body_fingerprint(request.url.path, req.model_dump(mode="json", exclude_unset=True))
        existing = runtime.idempotency.lookup(key, fingerprint)
        if existing is not None:  # a retry joins without taking a place, even when the server is full
            return await _join(request, runtime, key, existing, req.stream)
    # The places (one per sequence) are taken before tokenising, so the CPU work waiting for the pool
    # is bounded by the admission limit too; every way out before the result log exists gives them back.
    sequences = _sequences(req)
    if sequences > MAX_PROMPTS_PER_REQUEST:  # the per-request bound first: its message says to split the batch
        samples = _samples_per_prompt(req)
        runtime.record_rejection("invalid")
        if samples == 1:
            raise APIError(400, f"prompt holds {sequences} prompts; at most {MAX_PROMPTS_PER_REQUEST} per request: "
                           "split the batch", param="prompt")  # fmt: skip
        raise APIError(400, f"{sequences // samples} prompts x {_sequences_param(req)}={samples} is {sequences} "
                       f"sequences; at most {MAX_PROMPTS_PER_REQUEST} per request: split the batch",
                       param=_sequences_param(req))  # fmt: skip
    places = admission.take(sequences, scores=_scores_prompt(req), param=_sequences_param(req))
    try:
        prompts, params, generate, plan = await _prepare(runtime, admission, req, chat)
        # Again after the await, and with no await from here to remember(): one generation per key.
        existing = runtime.idempotency.lookup(key, fingerprint) if key is not None else None
        if existing is None:
            try:
                runtime.faults.maybe_fail()
            except APIError:
                runtime.record_failure("fault")
                raise
    except BaseException:
        places.release()
        raise
    if existing is not None and key is not None:
        places.release()
        return await _join(request, runtime, key, existing, req.stream)
    tokenizer = runtime.tokenizer
    fmt = CompletionFormat(
        chat=chat,
        response_id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        created=runtime.created_now(),
        model=runtime.settings.model_name,
        fingerprint=runtime.settings.strategy,
        include_usage=req.include_usage_in_stream(),
    )
    result = ResultLog()
    result.on_end(places.release)
    runtime.track(result)
    stop = req.stop_list()
    echo = isinstance(req, CompletionRequest) and req.echo
    texts = echoed_texts(tokenizer, req, prompts) if echo else None
    n = req.n or 1  # n choices per prompt: prompt i's j-th is choice i * n + j (OpenAI's order)
    samples = _samples_per_prompt(req)  # best_of: this many sampled, the n most likely returned
    if samples > 1:
        prompts = [ids for ids in prompts for _ in range(samples)]
        texts = [t for t in texts for _ in range(samples)] if texts is not None else None
    user_logprobs = params.logprobs is not None
    if samples > n and not user_logprobs:  # ranking needs each sample's log p; not returned unless asked
        params = dataclasses.replace(params, logprobs=0)
    share = bool(getattr(runtime.engine, "prefix_caching", False))

    async def produce(out: ResultLog) -> None:
        gens = [
            Generation(engine_loop, fmt.response_id + (f"-{i}" if i else ""), ids, _nth(params, i % samples),
                       tokenizer, stop)
            for i, ids in enumerate(prompts)
        ]  # fmt: skip
        for gen in gens:
            gen.wants_logprobs = user_logprobs
        try:
            echoes = await _echoes(engine_loop, prompts, params, texts)
            group = Group(n=n, samples=samples, share_prompt=share)
            await _run(gens, fmt, out, req.stream, echoes, tokenizer, generate, group, plan)
        except EngineFailure as exc:
            runtime.record_rejection("internal_error")
            runtime.record_failure("engine_error")
            raise APIError(500, f"internal error while generating: {exc}", code="internal_error") from exc
        except (APIError, asyncio.CancelledError):
            raise
        except Exception as exc:  # e.g. detokenising this request's output: fail it alone
            log.exception("request %s failed in the server", fmt.response_id)
            runtime.record_rejection("internal_error")
            runtime.record_failure("internal")
            message = (
                f"internal error while serving this request ({type(exc).__name__}); other requests are not "
                f"affected; the server log has the details under {fmt.response_id}"
            )
            raise APIError(500, message, code="internal_error") from exc
        finally:
            for gen in gens:
                gen.abort()

    result.run(produce)
    if key is not None:
        runtime.idempotency.remember(key, fingerprint, result)
    return await respond(request, runtime, result, req.stream)


async def _join(request: Request, runtime: ServerRuntime, key: str, existing: ResultLog, stream: bool) -> Response:
    log.info("idempotency key %r: joining the earlier request", key)
    return await respond(request, runtime, existing, stream)


async def _prepare(
    runtime: ServerRuntime, admission: Admission, req: ChatCompletionRequest | CompletionRequest, chat: bool
) -> tuple[list[list[int]], SamplingParams, bool, ToolPlan | None]:
    """Each prompt's token ids (tokenised on the CPU pool), the sampling parameters, whether to
    generate at all (max_tokens 0 with echo: no) and the tool plan (chat with tools), or a 4xx."""
    tokenizer = runtime.tokenizer
    plan: ToolPlan | None = None
    try:
        if isinstance(req, ChatCompletionRequest):
            plan = tool_plan(req, runtime.tool_call_parser, tokenizer.chat_template)
            tools = plan.tools if plan is not None else None
            prompts = [await runtime.run_cpu(chat_prompt_ids, tokenizer, req, tools)]
        else:
            vocab_size = getattr(tokenizer, "vocab_size", None)
            prompts = await runtime.run_cpu(completion_prompt_ids, tokenizer, req, vocab_size)
    except APIError as exc:
        if exc.status < 500:
            runtime.record_rejection("invalid")
        raise
    vocab_size = getattr(tokenizer, "vocab_size", None)
    if req.logit_bias and vocab_size is not None:
        ids = [int(k) for k in req.logit_bias if k.isascii() and k.isdigit()]
        if ids and max(ids) >= vocab_size:
            runtime.record_rejection("invalid")
            raise APIError(400, f"logit_bias token id {max(ids)} is out of range: this vocabulary has ids "
                           f"0..{vocab_size - 1}", param="logit_bias")  # fmt: skip
    if req.stop_token_ids and vocab_size is not None and max(req.stop_token_ids) >= vocab_size:
        runtime.record_rejection("invalid")
        raise APIError(400, f"stop_token_ids holds {max(req.stop_token_ids)}, out of range: this vocabulary has ids "
                       f"0..{vocab_size - 1}", param="stop_token_ids")  # fmt: skip
    structured = await _structured(runtime, req, plan)
    default = None if chat else runtime.settings.default_completion_max_tokens
    requested = req.requested_max_tokens()
    longest = max(len(p) for p in prompts)
    samples = _samples_per_prompt(req)
    if len(prompts) * samples > MAX_PROMPTS_PER_REQUEST:
        runtime.record_rejection("invalid")
        name = "best_of" if samples > (req.n or 1) else "n"
        raise APIError(400, f"{len(prompts)} prompts x {name}={samples} is {len(prompts) * samples} sequences; at most "
                       f"{MAX_PROMPTS_PER_REQUEST} per request: split the batch", param=name)  # fmt: skip
    if requested == 0:  # echo-only scoring (checked by reject_unsupported): the prompt must fit
        admission.max_tokens_for(longest, None, 1)
        return prompts, sampling_params(req, 1), False, None
    max_tokens = admission.max_tokens_for(longest, requested, default)
    try:
        return prompts, sampling_params(req, max_tokens, structured), True, plan
    except APIError:
        runtime.record_rejection("invalid")
        raise


async def _structured(
    runtime: ServerRuntime, req: ChatCompletionRequest | CompletionRequest, plan: ToolPlan | None
) -> StructuredSpec | None:
    """The request's output constraint, compiled once here on the CPU pool (a 400 if it cannot be):
    the engine thread then finds the grammar in the compiler's cache."""
    try:
        found = structured_spec(req)
        forced = plan.spec() if plan is not None else None
        if forced is not None:
            if found is not None:
                raise APIError(400, f"tool_choice {plan.mode!r} constrains the output to tool calls; {found[1]} "
                               "cannot constrain it too: remove one", param=found[1], code="invalid_value")  # fmt: skip
            found = (forced, "tools")
        if found is None:
            return None
        spec, param = found
        await compile_constraint(runtime.engine.structured.compiler, runtime.grammar_pool, spec, param)
    except APIError:
        runtime.record_rejection("invalid")
        raise
    return spec


async def _echoes(
    engine_loop: EngineLoop, prompts: list[list[int]], params: SamplingParams, texts: list[str] | None
) -> list[tuple[str, TokenLogprobs | None]] | None:
    """echo=true: each prompt's text, and with logprobs its tokens' log p through engine.score_tokens
    (the /v1/score path; the first token has none)."""
    if texts is None:
        return None
    out: list[tuple[str, TokenLogprobs | None]] = []
    for ids, text in zip(prompts, texts, strict=True):
        if params.logprobs is None:
            out.append((text, None))
            continue
        scored = None
        if len(ids) > 1:
            future = engine_loop.call(
                lambda engine, ids=ids, top=params.logprobs: engine.score_tokens(ids[:1], ids[1:], top), heavy=True
            )
            scored = await asyncio.wrap_future(future)
        out.append((text, prompt_logprobs(ids, scored)))
    return out


async def _run(
    gens: list[Generation],
    fmt: CompletionFormat,
    out: ResultLog,
    stream: bool,
    echoes: list[tuple[str, TokenLogprobs | None]] | None,
    tokenizer: Any,
    generate: bool,
    group: Group | None = None,
    plan: ToolPlan | None = None,
) -> None:
    """Run every generation; answer with n choices per prompt, in prompt order (under best_of, the
    n of each prompt's samples with the highest cumulative log-probability)."""
    group = group or Group()
    k = group.samples
    waits: list[Any] = []
    if generate:
        # With the prefix cache, a prompt's other samples start once its first one has prefilled:
        # they then take its committed full blocks from the cache (one prompt's K/V, shared).
        staggered = group.share_prompt and k > 1
        for i, gen in enumerate(gens):
            if not staggered or i % k == 0:
                await gen.start()
        if staggered:
            waits = [_start_after(gens[i], gens[i + 1 : i + k]) for i in range(0, len(gens), k)]
    out.mark_started()
    if stream:
        for first in fmt.first_chunks(len(gens) // k * group.n):  # the choices returned (best_of: n a prompt)
            out.append(first)
    results = await asyncio.gather(
        *(_choice(i, gen, fmt, out, stream, echoes[i] if echoes else None, tokenizer, generate, plan)
          for i, gen in enumerate(gens)), *waits
    )  # fmt: skip
    results = results[: len(gens)]
    completion = sum(r[3] for r in results)  # every sample's tokens count, returned or not (as OpenAI bills)
    # a prompt counts once however many choices it has (as OpenAI counts n > 1)
    usage = Usage.of(sum(g.num_prompt_tokens for g in gens[::k]), completion, sum(g.num_cached_tokens for g in gens[::k]))
    if k > group.n:
        results = [r for i in range(0, len(results), k) for r in _best(results[i : i + k], group.n)]
    if stream:
        if fmt.include_usage:
            out.append(fmt.usage_chunk(usage))
        out.append(DONE_EVENT)
    else:
        out.append(fmt.whole([(r[0], r[1], r[2], r[4]) for r in results], usage))
    out.finish()


async def _choice(
    index: int,
    gen: Generation,
    fmt: CompletionFormat,
    out: ResultLog,
    stream: bool,
    echo: tuple[str, TokenLogprobs | None] | None,
    tokenizer: Any,
    generate: bool,
    plan: ToolPlan | None = None,
) -> tuple[str | None, str | None, Any, int, list[dict[str, Any]] | None, float]:
    """One choice: (text, finish reason, logprobs body, completion tokens, tool calls, cumulative log p
    of the generated tokens); streamed as it comes."""
    cumulative = 0.0
    tool_stream = plan.streamer() if plan is not None and stream else None
    wants = gen.wants_logprobs
    pieces: list[str] = []
    logprobs = TokenLogprobs()
    if echo is not None:
        pieces.append(echo[0])
        if echo[1] is not None:
            logprobs.extend(echo[1])
        if stream:
            body = completion_logprobs(tokenizer, echo[1]) if echo[1] is not None else None
            out.append(fmt.chunk(echo[0], None if generate else "length", index, body))
    finish_reason: str | None = None if generate else "length"
    completion_tokens = 0
    offset = len(echo[0]) if echo is not None else 0
    async for delta in gen.deltas() if generate else _nothing():
        completion_tokens = delta.completion_tokens
        finish_reason = delta.finish_reason or finish_reason
        if delta.logprobs is not None:
            logprobs.extend(delta.logprobs)
            cumulative += sum(lp for lp in delta.logprobs.logprobs if lp is not None)
        if stream:
            body = None
            if wants and delta.logprobs is not None:
                body = _body(fmt.chat, tokenizer, delta.logprobs, offset)
            offset += len(delta.text)
            if tool_stream is not None:
                _stream_tools(tool_stream, delta, fmt, out, index, body)
            elif delta.text or delta.finish_reason or body is not None:
                out.append(fmt.chunk(delta.text, delta.finish_reason, index, body))
        else:
            pieces.append(delta.text)
    body = _body(fmt.chat, tokenizer, logprobs, 0) if wants and not stream else None
    text: str | None = "".join(pieces)
    calls = None
    if plan is not None and not stream and text is not None:
        text, calls, finish_reason = plan.message(text, finish_reason)
    return text, finish_reason, body, completion_tokens, calls, cumulative


@dataclass
class Group:
    """How a request's sequences group: `samples` per prompt (best_of, else n), `n` of them returned."""

    n: int = 1
    samples: int = 1
    share_prompt: bool = False  # stagger each prompt's samples so they share its KV through the prefix cache


def _sequences(req: ChatCompletionRequest | CompletionRequest) -> int:
    """Sequences the request runs at once: each prompt's samples (admission counts these, not requests)."""
    prompts = len(prompt_list(req)) if isinstance(req, CompletionRequest) else 1
    return prompts * _samples_per_prompt(req)


def _sequences_param(req: ChatCompletionRequest | CompletionRequest) -> str:
    if isinstance(req, CompletionRequest) and (req.best_of or 1) > (req.n or 1):
        return "best_of"
    return "n" if (req.n or 1) > 1 else "prompt"


def _scores_prompt(req: ChatCompletionRequest | CompletionRequest) -> bool:
    """echo with logprobs scores the prompt with forward passes of its own, as /v1/score does."""
    return isinstance(req, CompletionRequest) and req.echo and req.logprobs is not None


def _samples_per_prompt(req: ChatCompletionRequest | CompletionRequest) -> int:
    best_of = req.best_of if isinstance(req, CompletionRequest) else None
    return max(req.n or 1, best_of or 1)


async def _start_after(leader: Generation, followers: list[Generation]) -> None:
    """Start `followers` once `leader` has its first output: its prompt's full blocks are then committed."""
    await leader.first_output.wait()
    for gen in followers:
        await gen.start()


def _best(results: list[Any], n: int) -> list[Any]:
    """The n results with the highest cumulative log-probability, best first (OpenAI's best_of)."""
    return sorted(results, key=lambda r: r[5], reverse=True)[:n]


def _stream_tools(tool_stream: ToolStream, delta: TextDelta, fmt: CompletionFormat, out: ResultLog, index: int,
                  body: Any) -> None:  # fmt: skip
    """A streamed chat choice under tools: content deltas, then tool_calls deltas once they are known."""
    parts = tool_stream.feed(delta.text)
    reason = None
    if delta.finish_reason:
        tail, reason = tool_stream.finish(delta.finish_reason)
        parts += tail
    if not parts and (reason or body is not None):
        parts = [{}]
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        out.append(fmt.delta_chunk(part, reason if last else None, index, body if last else None))


def _nth(params: SamplingParams, j: int) -> SamplingParams:
    """The j-th of n samples: with a seed, seed + j, so the n choices differ yet repeat run to run."""
    if j == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + j) % SEED_LIMIT)


def _body(chat: bool, tokenizer: Any, logprobs: TokenLogprobs, offset: int) -> Any:
    return chat_logprobs(tokenizer, logprobs) if chat else completion_logprobs(tokenizer, logprobs, offset)


async def _nothing() -> AsyncIterator[TextDelta]:
    return
    yield


async def respond(request: Request, runtime: ServerRuntime, result: ResultLog, stream: bool) -> Response:
    strategy = runtime.settings.strategy
    if stream:
        await result.wait_started()
        if not result.events and result.error is not None:
            return error_response(_client_visible(result.error), strategy)
        return StreamingResponse(
            _stream(result),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, STRATEGY_HEADER: strategy},
        )
    if not await _ended_unless_disconnected(request, result):
        return Response(status_code=499, headers={STRATEGY_HEADER: strategy})
    if result.error is not None or not result.events:
        return error_response(_client_visible(result.error or _NO_RESULT), strategy)
    return JSONResponse(result.events[-1], headers={STRATEGY_HEADER: strategy})


async def _stream(result: ResultLog) -> AsyncIterator[str]:
    async for text in result.read_text():
        yield text
    if result.error is not None:
        error = _client_visible(result.error)
        yield sse(error_body(error.status, error.message, code=error.code))


async def _ended_unless_disconnected(request: Request, result: ResultLog) -> bool:
    """Wait for the result to end; False when the client left first (its generation is then aborted)."""

    async def collect() -> None:
        async for _ in result.read():
            pass

    reader = asyncio.ensure_future(collect())
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({reader, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        reader.cancel()
        raise
    finally:
        watcher.cancel()
    if reader.done():
        reader.result()
        return True
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    return False


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


_NO_RESULT = APIError(500, "the request ended without a result", code="internal_error")


def _client_visible(error: APIError) -> APIError:
    # 499 is for logs only (the client is gone); a joiner that outlived it sees a 500 it can retry.
    if error.status == 499:
        return APIError(500, "the original request was aborted before it finished; retry", code="aborted")
    return error
