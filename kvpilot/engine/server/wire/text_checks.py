"""Request text the tokenizer would choke on: lone UTF-16 surrogates, refused with a 400 naming where."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json

from kvpilot.engine.server.wire.api_error import APIError
from kvpilot.engine.server.wire.request_bodies import (
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


def check_unicode(req: BaseModel) -> None:
    """A 400 for the first string anywhere in the request (every field, keys, extensions) that is not
    valid Unicode (JSON allows unpaired \\ud800 escapes; the tokenizer and templates fail on them).
    Serialising the request to UTF-8 JSON finds whether there is one at C speed; only then is the
    request walked to name the field."""
    try:
        req.model_dump_json()
    except PydanticSerializationError:
        error = find_unicode_error(req.model_dump(mode="python"))
        if error is not None:
            raise error from None
        raise


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
    """The first string anywhere in a parsed JSON body that is not valid Unicode (keys included), named
    by its path. Found by bisection with C-speed encoding (each step encodes half of one container),
    so even a 200k-item body is searched in a few milliseconds, and never by recursion."""
    if not _bad(body):
        return None
    parts = [path] if path else []
    value = body
    while True:
        if isinstance(value, str):
            return unicode_error(".".join(parts) or "body", value)
        if isinstance(value, dict):
            items = list(value.items())
            i = _first_bad(len(items), lambda a, b, items=items: _bad(dict(items[a:b])))
            key, child = items[i]
            parts.append(str(key))
            if _bad(key):
                return unicode_error(".".join(parts), key)
            value = child
        elif isinstance(value, (list, tuple)):
            seq = value
            i = _first_bad(len(seq), lambda a, b, seq=seq: _bad(list(seq[a:b])))
            parts.append(str(i))
            value = seq[i]
        else:
            return None


def _bad(value: Any) -> bool:
    try:
        to_json(value)  # pydantic-core's encoder refuses lone surrogates
    except PydanticSerializationError as exc:
        return "surrogates not allowed" in str(exc)
    return False


def _first_bad(n: int, bad: Any) -> int:
    """The first index i < n whose item is bad, given bad(a, b): some item in [a, b) is bad (one is)."""
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if bad(lo, mid):
            hi = mid
        else:
            lo = mid
    return lo


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
