"""How chat and text completions look on the wire: whole responses and streamed chunks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvpilot.engine.server.responses import (
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

    def whole(self, choices: list[tuple[str, str | None, Any]], usage: Usage) -> dict[str, Any]:
        """choices: (text, finish reason, logprobs body or None) in index order."""
        if self.chat:
            chat = [
                ChatChoice(index=i, message=AssistantMessage(content=text), finish_reason=reason, logprobs=lp)
                for i, (text, reason, lp) in enumerate(choices)
            ]
            return ChatCompletion(choices=chat, usage=usage, **self._common()).model_dump()
        texts = [
            CompletionChoice(index=i, text=text, finish_reason=reason, logprobs=lp)
            for i, (text, reason, lp) in enumerate(choices)
        ]
        return Completion(choices=texts, usage=usage, **self._common()).model_dump()

    def first_chunk(self) -> str | None:
        if not self.chat:
            return None
        choice = ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))
        return self._chunk_event(ChatCompletionChunk(choices=[choice], **self._common()).model_dump())

    def chunk(self, text: str, finish_reason: str | None, index: int = 0, logprobs: Any = None) -> str:
        if self.chat:
            delta = ChatDelta(content=text) if text else ChatDelta()
            choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)
            body = ChatCompletionChunk(choices=[choice], **self._common()).model_dump()
        else:
            choice_t = CompletionChoice(index=index, text=text, finish_reason=finish_reason, logprobs=logprobs)
            body = Completion(choices=[choice_t], **self._common()).model_dump()
        return self._chunk_event(body)

    def usage_chunk(self, usage: Usage) -> str:
        if self.chat:
            body = ChatCompletionChunk(choices=[], usage=usage, **self._common()).model_dump()
        else:
            body = Completion(choices=[], usage=usage, **self._common()).model_dump()
        return sse(body)

    def _chunk_event(self, body: dict[str, Any]) -> str:
        # OpenAI sends "usage": null on every chunk only when the client asked for usage.
        if not self.include_usage:
            body.pop("usage", None)
        return sse(body)
