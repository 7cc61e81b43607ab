"""How chat and text completions look on the wire: whole responses and streamed chunks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvpilot.engine.server.wire.response_bodies import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    Usage,
)

DONE_EVENT = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


@dataclass
class CompletionFormat:
    """Everything fixed for one response: ids and timestamps repeat identically on replay."""

    chat: bool
    response_id: str
    created: int
    model: str
    fingerprint: str
    include_usage: bool = False

    def _common(self) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    def whole(self, choices: list[tuple[str | None, str | None, Any, Any]], usage: Usage) -> dict[str, Any]:
        """choices: (text, finish reason, logprobs body or None, tool calls or None) in index order."""
        if self.chat:
            chat = [
                ChatChoice(index=i, message=AssistantMessage(content=text, tool_calls=calls), finish_reason=reason,
                           logprobs=lp)
                for i, (text, reason, lp, calls) in enumerate(choices)
            ]  # fmt: skip
            body = ChatCompletion(choices=chat, usage=usage, **self._common()).model_dump()
            for choice in body["choices"]:
                if choice["message"]["tool_calls"] is None:
                    del choice["message"]["tool_calls"]
            return body
        texts = [
            CompletionChoice(index=i, text=text or "", finish_reason=reason, logprobs=lp)
            for i, (text, reason, lp, _) in enumerate(choices)
        ]
        return Completion(choices=texts, usage=usage, **self._common()).model_dump()

    def first_chunks(self, choices: int) -> list[str]:
        """Chat: one chunk per choice with its role, as OpenAI sends them (a client builds each choice's
        message from its own deltas, so a choice without one gets no role); text completions: none."""
        if not self.chat:
            return []
        return [self._chunk_event(ChatCompletionChunk(
                    choices=[ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))],
                    **self._common()).model_dump())
                for i in range(choices)]  # fmt: skip

    def chunk(self, text: str, finish_reason: str | None, index: int = 0, logprobs: Any = None) -> str:
        if self.chat:
            delta = ChatDelta(content=text) if text else ChatDelta()
            choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)
            body = ChatCompletionChunk(choices=[choice], **self._common()).model_dump()
        else:
            choice_t = CompletionChoice(index=index, text=text, finish_reason=finish_reason, logprobs=logprobs)
            body = Completion(choices=[choice_t], **self._common()).model_dump()
        return self._chunk_event(body)

    def delta_chunk(self, delta: dict[str, Any], finish_reason: str | None, index: int, logprobs: Any = None) -> str:
        """A chat chunk with a delta of {"content": ...} or {"tool_calls": [...]} (or neither)."""
        choice = ChatChunkChoice(index=index, delta=ChatDelta(**delta), finish_reason=finish_reason, logprobs=logprobs)
        return self._chunk_event(ChatCompletionChunk(choices=[choice], **self._common()).model_dump())

    def usage_chunk(self, usage: Usage) -> str:
        if self.chat:
            body = ChatCompletionChunk(choices=[], usage=usage, **self._common()).model_dump()
        else:
            body = Completion(choices=[], usage=usage, **self._common()).model_dump()
        return sse(body)

    def _chunk_event(self, body: dict[str, Any]) -> str:
        for choice in body.get("choices", ()):
            delta = choice.get("delta")
            if delta is not None and delta.get("tool_calls") is None:
                delta.pop("tool_calls", None)
        # OpenAI sends "usage": null on every chunk only when the client asked for usage.
        if not self.include_usage:
            body.pop("usage", None)
        return sse(body)
