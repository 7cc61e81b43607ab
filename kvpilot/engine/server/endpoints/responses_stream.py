"""Streaming /v1/responses: the chat stream's chunks turned into Responses events
(response.created ... response.output_text.delta ... response.completed), each an SSE event
`event: <type>` with `data: {"type": ..., "sequence_number": ...}`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvpilot.engine.server.endpoints.completions import SSE_HEADERS, serve_completion
from kvpilot.engine.server.http.errors import STRATEGY_HEADER, APIError
from kvpilot.engine.server.runtime.server_runtime import ServerRuntime
from kvpilot.engine.server.wire.responses_api import (
    ResponsesRequest,
    call_item,
    finish,
    from_chat,
    message_item,
    new_response,
    reject_unsupported_responses,
    responses_error_param,
    to_chat,
)


class ResponsesEvents:
    """State of one streamed response: its output items, as chat deltas arrive."""

    def __init__(self, req: ResponsesRequest) -> None:
        self.response = new_response(req)
        self.sequence = 0
        self.text: str | None = None  # the message item's text, once one is open
        self.message: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> function_call item
        self.finish_reason: str | None = None

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'), ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        return [self.event("response.created", response=dict(self.response)),
                self.event("response.in_progress", response=dict(self.response))]  # fmt: skip

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        out: list[str] = []
        if chunk.get("error"):
            error = chunk["error"]
            self.response["status"] = "failed"
            self.response["error"] = {"code": error.get("code") or "server_error", "message": error.get("message", "")}
            return [self.event("response.failed", response=self.response)]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if chunk.get("usage") is not None:
            out += self._close(chunk["usage"])
        return out

    def _text(self, piece: str) -> list[str]:
        out = []
        if self.message is None:
            self.message = message_item("", status="in_progress")
            self.message["content"] = []
            self.text = ""
            self.response["output"].append(self.message)
            out.append(self.event("response.output_item.added", output_index=self._index(self.message),
                                  item=dict(self.message)))  # fmt: skip
            out.append(self.event("response.content_part.added", item_id=self.message["id"],
                                  output_index=self._index(self.message), content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": []}))  # fmt: skip
        self.text = (self.text or "") + piece
        out.append(self.event("response.output_text.delta", item_id=self.message["id"],
                              output_index=self._index(self.message), content_index=0, delta=piece))  # fmt: skip
        return out

    def _call(self, call: dict[str, Any]) -> list[str]:
        out = []
        item = self.calls.get(call["index"])
        function = call.get("function") or {}
        if item is None:
            wire = {"id": call.get("id") or "", "function": {"name": function.get("name") or "", "arguments": ""}}
            item = self.calls[call["index"]] = call_item(wire, status="in_progress")
            self.response["output"].append(item)
            out.append(self.event("response.output_item.added", output_index=self._index(item), item=dict(item)))
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=self._index(item), delta=function["arguments"]))  # fmt: skip
        return out

    def _close(self, chat_usage: dict[str, Any]) -> list[str]:
        out = []
        if self.message is not None:
            index = self._index(self.message)
            part = {"type": "output_text", "text": self.text, "annotations": []}
            out.append(self.event("response.output_text.done", item_id=self.message["id"], output_index=index,
                                  content_index=0, text=self.text))  # fmt: skip
            out.append(self.event("response.content_part.done", item_id=self.message["id"], output_index=index,
                                  content_index=0, part=part))  # fmt: skip
            self.message["content"] = [part]
            self.message["status"] = "completed"
            out.append(self.event("response.output_item.done", output_index=index, item=self.message))
        for item in self.calls.values():
            item["status"] = "completed"
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=self._index(item), arguments=item["arguments"]))  # fmt: skip
            out.append(self.event("response.output_item.done", output_index=self._index(item), item=item))
        final = finish(self.response, self.finish_reason, chat_usage)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(self.event(kind, response=final))
        return out

    def _index(self, item: dict[str, Any]) -> int:
        for i, x in enumerate(self.response["output"]):
            if x is item:
                return i
        raise ValueError("output item not in the response")  # a bug: items are appended before their events


async def responses_events(req: ResponsesRequest, chat_stream: AsyncIterator[Any]) -> AsyncIterator[str]:
    """The chat SSE stream (`data: {chunk}` ... `data: [DONE]`) as Responses events."""
    state = ResponsesEvents(req)
    for event in state.start():
        yield event
    try:
        async for raw in chat_stream:
            text = raw.decode() if isinstance(raw, bytes) else raw
            for line in text.splitlines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for event in state.chunk(json.loads(line[6:])):
                    yield event
    finally:
        close = getattr(chat_stream, "aclose", None)
        if close is not None:
            await close()  # a client that left aborts the generation, as on the chat route


async def serve_response(request: Request, runtime: ServerRuntime, req: ResponsesRequest) -> Response:
    """POST /v1/responses: served as the equivalent chat completion, answered in the Responses shape."""
    try:
        reject_unsupported_responses(req)
        answer = await serve_completion(request, runtime, to_chat(req, req.stream))
    except APIError as exc:
        raise APIError(exc.status, exc.message, param=responses_error_param(exc.param), code=exc.code,
                       headers=exc.headers) from exc  # fmt: skip
    headers = {STRATEGY_HEADER: runtime.settings.strategy}
    if isinstance(answer, StreamingResponse):
        return StreamingResponse(responses_events(req, answer.body_iterator), media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **headers})  # fmt: skip
    body = json.loads(bytes(answer.body)) if answer.body else None
    if answer.status_code != 200 or body is None:
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body["error"]["param"] = responses_error_param(body["error"].get("param"))
        return JSONResponse(body, status_code=answer.status_code, headers=dict(answer.headers))
    return JSONResponse(from_chat(req, body), headers=headers)
