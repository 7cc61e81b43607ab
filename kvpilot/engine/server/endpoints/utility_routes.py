"""vLLM's utility routes that clients probe: /tokenize, /detokenize, /version, /tokenizer_info."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from kvpilot import __version__
from kvpilot.engine.server.http.errors import APIError
from kvpilot.engine.server.runtime.server_runtime import ServerRuntime
from kvpilot.engine.server.wire.prompts import chat_messages
from kvpilot.engine.server.wire.request_bodies import ChatMessage, Tool, _Body
from kvpilot.engine.server.wire.request_limits import MAX_MESSAGES
from kvpilot.engine.server.wire.text_checks import check_unicode

utility_router = APIRouter()


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = Field(default=None, description="Text to tokenize (or messages).")
    messages: list[ChatMessage] | None = Field(default=None, description="Rendered with the chat template first.")
    tools: list[Tool] | None = Field(default=None, description="With messages: rendered by the template, as in chat.")
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int] = Field(description="Token ids to turn back into text.")


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


def _ready(request: Request, model: str | None) -> ServerRuntime:
    runtime: ServerRuntime = request.app.state.runtime
    runtime.require_ready()
    if model is not None:
        runtime.check_model(model)
    return runtime


@utility_router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    runtime = _ready(request, body.model)
    # the limits and admission of the completion routes: checked text, bounded length, a place taken
    check_unicode(body)
    if body.messages is not None and len(body.messages) > MAX_MESSAGES:
        raise APIError(400, f"messages holds {len(body.messages)} messages; at most {MAX_MESSAGES} are accepted",
                       param="messages", code="too_many_items")  # fmt: skip
    _, admission = runtime.require_ready()
    text_chars = len(body.prompt or "") + sum(len(m.text()) for m in body.messages or ())
    admission.check_prompt_chars(text_chars, "prompt" if body.prompt is not None else "messages")
    admission.acquire()
    try:
        return await _tokenize(runtime, body)
    finally:
        admission.release()


async def _tokenize(runtime: ServerRuntime, body: TokenizeRequest) -> TokenizeResponse:
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "send exactly one of 'prompt' (text) or 'messages' (a chat)", param="prompt")
    tokenizer = runtime.tokenizer
    text = body.prompt
    if body.tools is not None and body.messages is None:
        raise APIError(400, "tools are rendered by the chat template: send them with 'messages'", param="tools")
    if body.messages is not None:
        messages = chat_messages(body)
        tools = {"tools": [t.model_dump(exclude_none=True) for t in body.tools]} if body.tools else {}
        try:
            text = await runtime.run_cpu(
                lambda: tokenizer.apply_chat_template(messages, add_generation_prompt=body.add_generation_prompt, **tools)
            )
        except ValueError as exc:
            raise APIError(400, f"cannot build the chat prompt: {exc}", param="messages") from exc
    ids = await runtime.run_cpu(tokenizer.encode, text, body.add_special_tokens)
    max_len = runtime.admission.max_model_len if runtime.admission is not None else 0
    return TokenizeResponse(count=len(ids), max_model_len=max_len, tokens=ids)


@utility_router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    runtime = _ready(request, body.model)
    _, admission = runtime.require_ready()
    if len(body.tokens) > admission.max_model_len:
        raise APIError(400, f"tokens holds {len(body.tokens)} ids; at most {admission.max_model_len} (this model's "
                       "maximum context length) are accepted", param="tokens", code="too_many_items")  # fmt: skip
    admission.acquire()
    try:
        return await _detokenize(runtime, body)
    finally:
        admission.release()


async def _detokenize(runtime: ServerRuntime, body: DetokenizeRequest) -> DetokenizeResponse:
    vocab = runtime.tokenizer.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"token ids {bad[:5]} are out of range: this vocabulary has ids 0..{vocab - 1}",
                       param="tokens")  # fmt: skip
    # Special tokens stay, as vLLM's /detokenize keeps them: lm-eval decodes a context that starts
    # with the EOS prefix token and sends the text back; dropping it would score another prompt.
    text = await runtime.run_cpu(lambda: runtime.tokenizer.decode(body.tokens, skip_special_tokens=False))
    return DetokenizeResponse(prompt=text)


@utility_router.get("/version", response_model=VersionResponse)
async def version() -> VersionResponse:
    return VersionResponse(version=__version__)


@utility_router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict[str, Any]:
    runtime = _ready(request, None)
    tok = runtime.tokenizer
    max_len = runtime.admission.max_model_len if runtime.admission is not None else 0
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "vocab_size": tok.vocab_size,
        "model_max_length": max_len,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token_ids": list(tok.eos_token_ids),
        "add_bos_token": tok.add_bos_token,
        "chat_template": tok.chat_template,
    }
