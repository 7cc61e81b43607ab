"""From an API request to what the engine takes: prompt token ids and SamplingParams."""

from __future__ import annotations

import json
from typing import Any

from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.server.wire.api_error import APIError
from kvpilot.engine.server.wire.request_bodies import ChatCompletionRequest, CompletionRequest, SamplingFields
from kvpilot.engine.server.wire.text_checks import find_unicode_error
from kvpilot.engine.server.wire.vllm_extensions import reject_vllm_extensions
from kvpilot.engine.structured.spec import StructuredSpec

DEFAULT_TEMPERATURE = 1.0


def reject_unsupported(req: SamplingFields) -> None:
    """A 400 for options this server does not implement, instead of silently ignoring them."""
    reject_vllm_extensions(req.model_extra)
    if req.n not in (None, 1) and isinstance(req, CompletionRequest) and req.echo:
        _unsupported("n", f"n={req.n} with echo=true is not supported: echo scores the prompt once; send n=1")
    if req.prompt_logprobs is not None:
        _unsupported("prompt_logprobs", "prompt_logprobs is not supported by this server; for prompt "
                     "log-probabilities use echo=true with logprobs")  # fmt: skip
    if req.min_p not in (None, 0, 0.0):
        _unsupported("min_p", f"min_p={req.min_p} is not supported; use top_p / top_k, or send 0")
    if req.use_beam_search:
        _unsupported("use_beam_search", "beam search is not supported; send use_beam_search=false")
    if isinstance(req, ChatCompletionRequest):
        _reject_chat_only(req)
    if isinstance(req, CompletionRequest):
        if req.max_tokens == 0 and not req.echo:
            _unsupported("max_tokens", "max_tokens=0 is only allowed with echo=true (score the prompt); send >= 1")
        if req.suffix:
            _unsupported("suffix", "suffix (insertion) is not supported")
        if req.best_of is not None and req.best_of < (req.n or 1):
            _unsupported("best_of", f"best_of={req.best_of} must be >= n={req.n}: the n best of best_of samples "
                         "are returned")  # fmt: skip
        if (req.best_of or 1) > 1 and req.stream:
            _unsupported("best_of", "best_of > 1 cannot stream: the best samples are known only when all end; "
                         "send stream=false or best_of=1")  # fmt: skip
        if (req.best_of or 1) > 1 and req.echo:
            _unsupported("best_of", "best_of > 1 with echo=true is not supported: echo scores the prompt once")


def _reject_chat_only(req: ChatCompletionRequest) -> None:
    if req.top_logprobs and not req.logprobs:
        _unsupported("top_logprobs", "top_logprobs needs logprobs=true")
    kwargs = req.chat_template_kwargs
    if kwargs is not None:
        reserved = sorted(set(kwargs) & RESERVED_TEMPLATE_NAMES)
        if reserved:
            _unsupported("chat_template_kwargs", f"chat_template_kwargs cannot set {reserved}: the server sets those "
                         "(messages, tools, add_generation_prompt, bos_token, eos_token)")  # fmt: skip
    if req.continue_final_message:
        if req.messages[-1].role != "assistant":
            _unsupported("continue_final_message", "continue_final_message continues the last message, which must "
                         f"be the assistant's; it is {req.messages[-1].role!r}")  # fmt: skip
        if req.add_generation_prompt:
            _unsupported("add_generation_prompt", "add_generation_prompt must be false with continue_final_message "
                         "(the assistant's message is continued, not started)")  # fmt: skip
    for name in ("functions", "function_call"):
        if getattr(req, name) is not None:
            _unsupported(name, f"{name} (the deprecated form) is not supported; send tools and tool_choice instead")


def _unsupported(param: str, message: str) -> None:
    raise APIError(400, message, param=param, code="unsupported_parameter")


def chat_messages(req: Any) -> list[dict[str, Any]]:
    """The messages as the chat template receives them (HF's convention: a tool call's arguments as
    a dict), or a 400 naming the message whose tool call is malformed."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        message: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            if m.role != "assistant":
                raise APIError(400, f"messages.{i}: only assistant messages carry tool_calls, this one is {m.role!r}",
                               param=f"messages.{i}.tool_calls")  # fmt: skip
            message["tool_calls"] = [_call_for_template(i, j, c) for j, c in enumerate(m.tool_calls)]
        out.append(message)
    return out


def _call_for_template(i: int, j: int, call: Any) -> dict[str, Any]:
    param = f"messages.{i}.tool_calls.{j}.function.arguments"
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError as exc:
        raise APIError(400, f"{param} is not valid JSON ({exc}); send the arguments object as JSON text",
                       param=param) from exc  # fmt: skip
    except RecursionError as exc:
        raise APIError(400, f"{param} nests deeper than the JSON parser goes; send a flatter arguments object",
                       param=param) from exc  # fmt: skip
    if not isinstance(arguments, dict):
        raise APIError(400, f"{param} must be a JSON object, got {call.function.arguments[:100]!r}", param=param)
    unicode = find_unicode_error(arguments, param)  # an escaped lone surrogate (\\ud800) decodes to one
    if unicode is not None:
        raise unicode
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}


RESERVED_TEMPLATE_NAMES = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}


def chat_prompt_ids(tokenizer: Any, req: ChatCompletionRequest, tools: list[dict[str, Any]] | None = None) -> list[int]:
    messages = chat_messages(req)
    kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    add_prompt = req.add_generation_prompt and not req.continue_final_message
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_prompt, **kwargs)
    except ValueError as exc:
        raise APIError(400, f"cannot build the chat prompt: {exc}", param="messages") from exc
    if req.continue_final_message:  # end the prompt right after the final message's text (as vLLM does)
        final = messages[-1]["content"]
        at = text.rfind(final) if final else -1
        if at < 0:
            raise APIError(400, "continue_final_message: the chat template does not render the final message's text "
                           "verbatim, so it cannot be continued", param="continue_final_message")  # fmt: skip
        text = text[: at + len(final)]
    return list(tokenizer.encode(text))


MAX_PROMPTS_PER_REQUEST = 256  # each is its own sequence; a bigger batch belongs in several requests


def prompt_list(req: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts: a string, a token list, or a list of either."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return list(prompt)  # type: ignore[arg-type]
    return [prompt]  # type: ignore[list-item]


def completion_prompt_ids(tokenizer: Any, req: CompletionRequest, vocab_size: int | None) -> list[list[int]]:
    """Token ids of each prompt, in order (each becomes its own sequence and choice)."""
    prompts = prompt_list(req)
    if len(prompts) > MAX_PROMPTS_PER_REQUEST:
        raise APIError(
            400,
            f"prompt holds {len(prompts)} prompts; at most {MAX_PROMPTS_PER_REQUEST} per request: split the batch",
            param="prompt",
        )
    return [_prompt_ids(tokenizer, p, vocab_size, f"prompt.{i}" if len(prompts) > 1 else "prompt")
            for i, p in enumerate(prompts)]  # fmt: skip


def echoed_texts(tokenizer: Any, req: CompletionRequest, prompts: list[list[int]]) -> list[str]:
    """echo=true: a text prompt comes back as sent, a token prompt as its decoded text."""
    return [p if isinstance(p, str) else tokenizer.decode(ids) for p, ids in zip(prompt_list(req), prompts, strict=True)]


def _prompt_ids(tokenizer: Any, prompt: str | list[int], vocab_size: int | None, param: str) -> list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, f"{param} is empty: send at least one character or token", param=param)
        return list(tokenizer.encode(prompt))
    ids = [int(t) for t in prompt]
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        raise APIError(
            400,
            f"{param} token id {max(ids)} is out of range: this model's vocabulary has ids 0..{vocab_size - 1}",
            param=param,
        )
    return ids


def logit_bias(req: SamplingFields) -> dict[int, float]:
    """OpenAI's {"token id": bias} as ints, or a 400 naming the bad key."""
    out: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        if not (key.isascii() and key.isdigit()):  # "²".isdigit() is True, int("²") fails
            raise APIError(400, f"logit_bias key {key!r} is not a token id (a non-negative integer)", param="logit_bias")
        if not -100.0 <= value <= 100.0:
            raise APIError(400, f"logit_bias[{key}] = {value} is outside [-100, 100]", param="logit_bias")
        out[int(key)] = float(value)
    return out


def requested_logprobs(req: SamplingFields) -> int | None:
    """Alternatives per token the response lists (None: no logprobs at all)."""
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    if isinstance(req, CompletionRequest):
        return req.logprobs
    return None


def sampling_params(req: SamplingFields, max_tokens: int, structured: StructuredSpec | None = None) -> SamplingParams:
    top_k = req.top_k if req.top_k not in (None, 0) else -1
    try:
        return SamplingParams(
            temperature=DEFAULT_TEMPERATURE if req.temperature is None else float(req.temperature),
            top_p=1.0 if req.top_p is None else float(req.top_p),
            top_k=int(top_k),
            seed=req.seed,
            max_tokens=max_tokens,
            stop=req.stop_list(),
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            logprobs=requested_logprobs(req),
            presence_penalty=float(req.presence_penalty or 0.0),
            frequency_penalty=float(req.frequency_penalty or 0.0),
            repetition_penalty=1.0 if req.repetition_penalty is None else float(req.repetition_penalty),
            logit_bias=logit_bias(req),
            min_tokens=min(req.min_tokens or 0, max_tokens),
            structured=structured,
        )
    except ValueError as exc:
        raise APIError(400, str(exc), code="invalid_value") from exc
