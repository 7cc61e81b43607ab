"""From an API request to what the engine takes: prompt token ids and SamplingParams."""

from __future__ import annotations

from typing import Any

from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.server.errors import APIError
from kvpilot.engine.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields

DEFAULT_TEMPERATURE = 1.0


def reject_unsupported(req: SamplingFields) -> None:
    """A 400 for options this server does not implement, instead of silently ignoring them."""
    if req.n not in (None, 1):
        _unsupported("n", f"n={req.n} is not supported: this server returns one choice per request (n=1)")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value not in (None, 0, 0.0):
            _unsupported(name, f"{name}={value} is not supported; omit it or send 0")
    if isinstance(req, ChatCompletionRequest):
        _reject_chat_only(req)
    if isinstance(req, CompletionRequest):
        if req.logprobs is not None:
            _unsupported("logprobs", "logprobs are not supported by /v1/completions; use POST /v1/score")
        if req.echo:
            _unsupported("echo", "echo=true is not supported; the prompt is not returned")
        if req.suffix:
            _unsupported("suffix", "suffix (insertion) is not supported")
        if req.best_of not in (None, 1):
            _unsupported("best_of", f"best_of={req.best_of} is not supported; only best_of=1")


def _reject_chat_only(req: ChatCompletionRequest) -> None:
    if req.logprobs or req.top_logprobs:
        _unsupported("logprobs", "logprobs are not supported by /v1/chat/completions; use POST /v1/score")
    for name in ("tools", "tool_choice", "functions", "function_call"):
        if getattr(req, name) is not None:
            _unsupported(
                name, f"{name} is not supported yet: this server does not call tools; remove {name!r} from the request"
            )
    fmt = req.response_format
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text" and len(fmt) == 1):
        kind = fmt.get("type") if isinstance(fmt, dict) else type(fmt).__name__
        _unsupported(
            "response_format",
            f"response_format {kind!r} is not supported yet: only {{'type': 'text'}}; structured output "
            "(json_object, json_schema) is not enforced by this server, so remove response_format",
        )


def _unsupported(param: str, message: str) -> None:
    raise APIError(400, message, param=param, code="unsupported_parameter")


def chat_prompt_ids(tokenizer: Any, req: ChatCompletionRequest) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    try:
        text = tokenizer.apply_chat_template(messages)
    except ValueError as exc:
        raise APIError(400, f"cannot build the chat prompt: {exc}", param="messages") from exc
    return list(tokenizer.encode(text))


def completion_prompt_ids(tokenizer: Any, req: CompletionRequest, vocab_size: int | None) -> list[int]:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(
                400,
                f"prompt holds {len(prompt)} prompts; this server takes one prompt per request "
                "(a string or a list of token ids)",
                param="prompt",
                code="unsupported_parameter",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt is empty: send at least one character or token", param="prompt")
        return list(tokenizer.encode(prompt))
    ids = [int(t) for t in prompt]
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        raise APIError(
            400,
            f"prompt token id {max(ids)} is out of range: this model's vocabulary has ids 0..{vocab_size - 1}",
            param="prompt",
        )
    return ids


def sampling_params(req: SamplingFields, max_tokens: int) -> SamplingParams:
    top_k = req.top_k if req.top_k not in (None, 0) else -1
    try:
        return SamplingParams(
            temperature=DEFAULT_TEMPERATURE if req.temperature is None else float(req.temperature),
            top_p=1.0 if req.top_p is None else float(req.top_p),
            top_k=int(top_k),
            seed=req.seed,
            max_tokens=max_tokens,
            stop=req.stop_list(),
            ignore_eos=req.ignore_eos,
        )
    except ValueError as exc:
        raise APIError(400, str(exc), code="invalid_value") from exc
