"""Request text the tokenizer would choke on: lone UTF-16 surrogates, refused with a 400 naming where."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvpilot.engine.server.api_error import APIError
from kvpilot.engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    ScoreRequest,
)


def request_texts(req: SamplingFields | ScoreRequest) -> Iterator[tuple[str, str]]:
    """(field path, text) for every free text of a request."""
    if isinstance(req, ScoreRequest):
        yield "prompt", req.prompt
        yield "continuation", req.continuation
        return
    if isinstance(req, CompletionRequest):
        if isinstance(req.prompt, str):
            yield "prompt", req.prompt
        else:
            for i, item in enumerate(req.prompt):
                if isinstance(item, str):
                    yield f"prompt.{i}", item
    if isinstance(req, ChatCompletionRequest):
        for i, message in enumerate(req.messages):
            if isinstance(message.content, str):
                yield f"messages.{i}.content", message.content
            elif message.content is not None:
                for j, part in enumerate(message.content):
                    yield f"messages.{i}.content.{j}.text", part.text
            if message.name is not None:
                yield f"messages.{i}.name", message.name
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or ())
    for i, stop in enumerate(stops):
        yield ("stop" if isinstance(req.stop, str) else f"stop.{i}"), stop


def check_unicode(req: SamplingFields | ScoreRequest) -> None:
    """A 400 for the first text that is not valid Unicode (JSON allows unpaired \\ud800 escapes)."""
    for field, text in request_texts(req):
        error = unicode_error(field, text)
        if error is not None:
            raise error


def unicode_error(field: str, text: str) -> APIError | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return APIError(
            400,
            f"{field} is not valid Unicode: it holds a lone UTF-16 surrogate (U+{ord(text[exc.start]):04X}) "
            f"at character {exc.start}; send text whose \\ud800-\\udfff escapes come in high-low pairs",
            param=field,
            code="invalid_unicode",
        )
    return None


def find_unicode_error(body: Any, path: str = "") -> APIError | None:
    """The first string anywhere in a parsed JSON body that is not valid Unicode (keys included)."""
    if isinstance(body, str):
        return unicode_error(path or "body", body)
    items = body.items() if isinstance(body, dict) else enumerate(body) if isinstance(body, list) else ()
    for key, value in items:
        where = f"{path}.{key}" if path else str(key)
        error = (unicode_error(where, key) if isinstance(key, str) else None) or find_unicode_error(value, where)
        if error is not None:
            return error
    return None


def prompt_chars(req: SamplingFields | ScoreRequest) -> int:
    """Characters of the prompt text (messages for chat; prompt + continuation for score)."""
    return sum(len(text) for field, text in request_texts(req) if not field.startswith("stop"))


def longest_token_chars(tokenizer: object) -> int | None:
    """Characters the longest vocabulary entry decodes to (None when the tokenizer cannot say)."""
    decode = getattr(tokenizer, "decode", None)
    size = getattr(tokenizer, "vocab_size", None)
    if decode is None or not isinstance(size, int) or size < 1:
        return None
    try:
        return max(max(len(decode([i], skip_special_tokens=False)) for i in range(size)), 1)
    except Exception:  # a tokenizer that cannot decode single ids: no early length check
        return None
