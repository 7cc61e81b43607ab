"""Token log-probabilities on the wire: the completions shape (tokens, token_logprobs, top_logprobs,
text_offset) and the chat shape (content: [{token, logprob, bytes, top_logprobs}])."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpilot.engine.server.wire.response_bodies import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)

TopList = list[tuple[int, float]]


@dataclass
class TokenLogprobs:
    """Per token: its id, its log p (None: the first prompt token, which nothing predicts), its top list."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    tops: list[TopList | None] = field(default_factory=list)

    def add(self, token_id: int, logprob: float | None, top: TopList | None) -> None:
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        self.tops.append(top)

    def extend(self, other: TokenLogprobs) -> None:
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        self.tops += other.tops

    def __len__(self) -> int:
        return len(self.token_ids)


def prompt_logprobs(prompt_ids: list[int], scored: tuple[list[float], list[TopList]] | None) -> TokenLogprobs:
    """The echoed prompt: None for its first token, then engine.score_tokens(prompt[:1], prompt[1:])."""
    out = TokenLogprobs()
    out.add(prompt_ids[0], None, None)
    if scored is not None:
        for token, lp, top in zip(prompt_ids[1:], *scored, strict=True):
            out.add(token, lp, top)
    return out


def token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


def completion_logprobs(tokenizer: Any, lp: TokenLogprobs, offset: int = 0) -> CompletionLogprobs:
    tokens = [token_text(tokenizer, t) for t in lp.token_ids]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    tops: list[dict[str, float] | None] = []
    for top in lp.tops:
        if top is None:
            tops.append(None)
            continue
        entry: dict[str, float] = {}
        for token_id, value in top:
            entry.setdefault(token_text(tokenizer, token_id), value)  # two ids may print alike: keep the likelier
        tops.append(entry)
    return CompletionLogprobs(tokens=tokens, token_logprobs=lp.logprobs, top_logprobs=tops, text_offset=offsets)


def _top(tokenizer: Any, token_id: int, value: float) -> TopLogprob:
    text = token_text(tokenizer, token_id)
    return TopLogprob(token=text, logprob=value, bytes=list(text.encode("utf-8")))


def chat_logprobs(tokenizer: Any, lp: TokenLogprobs) -> ChatLogprobs:
    content = []
    for token_id, value, top in zip(lp.token_ids, lp.logprobs, lp.tops, strict=True):
        head = _top(tokenizer, token_id, float(value if value is not None else 0.0))
        alternatives = [_top(tokenizer, t, v) for t, v in (top or [])]
        content.append(ChatTokenLogprob(**head.model_dump(), top_logprobs=alternatives))
    return ChatLogprobs(content=content)
