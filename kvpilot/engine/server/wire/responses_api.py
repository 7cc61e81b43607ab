"""A minimal, honest subset of OpenAI's Responses API (POST /v1/responses) over the chat path.

A request is translated into a chat completion (instructions -> a system message, input items ->
messages, flat function tools -> chat tools, text.format -> response_format, max_output_tokens ->
max_completion_tokens), served by serve_completion, and its answer translated back into a
`response` object. Nothing is stored: `store` must be false or left out, and what needs stored
state (previous_response_id, background, GET /v1/responses/{id}) is a 400 / 404.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvpilot.engine.server.wire.api_error import APIError
from kvpilot.engine.server.wire.request_bodies import (
    MAX_TEMPERATURE,
    SEED_LIMIT,
    ChatCompletionRequest,
    _Body,
)
from kvpilot.engine.server.wire.vllm_extensions import REFUSED

CHAT_TO_RESPONSES_PARAM = {"messages": "input", "max_completion_tokens": "max_output_tokens",
                           "max_tokens": "max_output_tokens", "response_format": "text.format"}  # fmt: skip


class InputText(_Body):
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(union_mode="left_to_right")]


class FunctionTool(_Body):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextConfig(_Body):
    format: dict[str, Any] | None = Field(default=None, description="{type: text | json_object | json_schema, ...}")


# vLLM's sampling extensions, which clients (guidellm, vLLM's own benchmarks) also send to /v1/responses:
# passed to the chat completion that serves the response, so they act exactly as they do there, and
# the vLLM extensions chat refuses by name (vllm_extensions.REFUSED) are refused here too.
SAMPLING_EXTENSIONS = (
    "stop", "ignore_eos", "min_tokens", "stop_token_ids", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "structured_outputs", "guided_decoding_backend", "guided_whitespace_pattern", "chat_template_kwargs",
    *REFUSED,
)  # fmt: skip


class ResponsesRequest(_Body):
    model_config = ConfigDict(extra="allow", strict=True)  # the extensions above; other unknown fields are ignored

    model: str
    input: str | list[InputItem] = Field(description="A user message, or a list of message / function call items.")
    instructions: str | None = Field(default=None, description="A system message before the input.")
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, lt=SEED_LIMIT, description="Extension, as in chat.")
    stream: bool = False
    tools: list[FunctionTool] | None = Field(default=None, min_length=1, max_length=128)
    tool_choice: Any = Field(default=None, description="'none' | 'auto' | 'required' | {type: function, name}.")
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    store: bool | None = Field(default=None, description="Only false: responses are not stored.")
    metadata: dict[str, str] | None = Field(default=None, description="Returned as sent.")
    user: str | None = None
    previous_response_id: str | None = Field(default=None, description="Not supported (400): nothing is stored.")
    background: bool | None = Field(default=None, description="Not supported (400) unless false.")
    include: list[str] | None = Field(default=None, description="Not supported (400) unless empty.")
    reasoning: dict[str, Any] | None = Field(default=None, description="Not supported (400).")
    truncation: Literal["disabled", "auto"] | None = Field(default=None, description="Only 'disabled'.")


class ResponseObject(BaseModel):
    """The documented shape of a `response` (the fields kvpilot fills; see docs/api.md)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: dict[str, Any] | None
    incomplete_details: dict[str, Any] | None
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None
    store: bool


def reject_unsupported_responses(req: ResponsesRequest) -> None:
    refusals = [
        ("store", req.store is True, "responses are not stored by this server; send store=false or leave it out"),
        ("previous_response_id", req.previous_response_id is not None,
         "responses are not stored, so none can be continued; send the whole conversation as input items"),
        ("background", bool(req.background), "background responses need storage; send background=false"),
        ("include", bool(req.include), "no extra output data is available; send include=[]"),
        ("reasoning", req.reasoning is not None, "there is no reasoning configuration; remove reasoning"),
        ("truncation", req.truncation == "auto", "input is never truncated; send truncation='disabled'"),
    ]  # fmt: skip
    for param, refused, why in refusals:
        if refused:
            raise APIError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def to_chat(req: ResponsesRequest, stream: bool) -> ChatCompletionRequest:
    """The chat completion that serves this response."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)  # consecutive calls are one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    body: dict[str, Any] = {"model": req.model, "messages": messages, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p", "seed", "parallel_tool_calls", "user"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                         for t in req.tools]  # fmt: skip
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    if req.text is not None and req.text.format is not None:
        body["response_format"] = _response_format(req.text.format)
    extensions = {k: v for k, v in (req.model_extra or {}).items() if k in SAMPLING_EXTENSIONS and v is not None}
    body.update(extensions)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        if error["loc"] and error["loc"][0] in extensions:
            raise APIError(400, f"{where}: {error['msg']}", param=str(error["loc"][0])) from exc
        raise APIError(400, f"input: {where}: {error['msg']}", param="input") from exc


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    if fmt.get("type") != "json_schema":
        return fmt
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    extra = sorted(set(fmt) - {"type", "name", "schema", "strict", "description"})
    if extra:
        raise APIError(400, f"text.format has unsupported keys {extra}", param="text.format")
    return {"type": "json_schema", "json_schema": schema}


def new_response(req: ResponsesRequest, response_id: str | None = None) -> dict[str, Any]:
    """The response object before any output (status in_progress)."""
    return {
        "id": response_id or "resp_" + uuid.uuid4().hex,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "store": False,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "text": {"format": (req.text.format if req.text and req.text.format else {"type": "text"})},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "truncation": "disabled",
        "metadata": req.metadata or {},
        "usage": None,
        "user": req.user,
    }


def message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}  # fmt: skip


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if chat_usage is None:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": chat_usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}  # fmt: skip


def finish(response: dict[str, Any], finish_reason: str | None, chat_usage: dict[str, Any] | None) -> dict[str, Any]:
    """Set the final status from the chat finish reason, and the usage."""
    if finish_reason == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        response["status"] = "completed"
    response["usage"] = usage(chat_usage)
    return response


def from_chat(req: ResponsesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion -> the response object."""
    response = new_response(req, "resp_" + chat["id"].removeprefix("chatcmpl-"))
    response["created_at"] = chat["created"]
    choice = chat["choices"][0]
    message = choice["message"]
    if message.get("content"):
        response["output"].append(message_item(message["content"]))
    for call in message.get("tool_calls") or []:
        response["output"].append(call_item(call))
    return finish(response, choice["finish_reason"], chat["usage"])


def responses_error_param(param: str | None) -> str | None:
    """A chat field named in an error, as the Responses field the client sent."""
    if param is None:
        return None
    head, _, rest = param.partition(".")
    mapped = CHAT_TO_RESPONSES_PARAM.get(head)
    return (mapped + ("." + rest if rest else "")) if mapped else param
