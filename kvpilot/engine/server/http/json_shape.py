"""How many JSON values and objects a body holds, how deep it nests, and where its large top-level
members lie, counted on the raw bytes as they arrive, before any of it is parsed.

Parsing and validating a body holds the GIL (json.loads and pydantic are C code that never
releases it), so a thread would not keep the event loop free: a body of 200,000 small messages
stalled it for seconds. Counting is cheap bytes work (replace, one table lookup, a cumsum over the
structural bytes) per chunk, so a body is refused as soon as it holds more than the limits, and
the bodies that pass parse in bounded time.

Counts are exact for valid JSON outside strings: a value is counted at each comma and each opening
bracket (values = commas + containers), escapes inside strings are skipped, and a chunk may end
anywhere (inside a string, after a backslash). Escapes are blanked with replacements of the same
length, so every offset is the byte's offset in the body.
"""

from __future__ import annotations

import json

import numpy as np

MAX_JSON_DEPTH = 64
MAX_JSON_VALUES = 200_000  # e.g. one prompt of 200k token ids, or 64 of 3k each
MAX_JSON_OBJECTS = 10_000  # objects are what costs (a pydantic model each): 4096 messages and their tools

_STRUCTURAL = bytes(
    1 if b in b'"[]{},' else 0 for b in range(256)
)  # bytes.translate table: 1 where structural
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[list(b"[{")] = 1
_DELTA[list(b"]}")] = -1
_CONTINUATION = bytes(range(0x80, 0xC0))  # UTF-8 bytes that continue a character
_QUOTE, _COMMA, _OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY = b'"', b",", b"{", b"}", b"["


def _blank_escapes(chunk: bytes) -> bytes:
    """Escaped backslashes and quotes as `__` (same length): no quote left is inside an escape."""
    return chunk.replace(b"\\\\", b"__").replace(b'\\"', b"__")


class JsonShape:
    """Fed a body chunk by chunk: `values`, `objects` and `max_depth` so far, and `large_members`:
    the (start, end) byte spans of top-level members longer than `member_bytes` (the text between
    the separators around them: `"key": value`, whitespace included)."""

    def __init__(self, member_bytes: int | None = None) -> None:
        self.values = 0
        self.objects = 0
        self.depth = 0
        self.max_depth = 0
        self.member_bytes = member_bytes
        self.large_members: list[tuple[int, int]] = []
        self._offset = 0  # bytes fed so far
        self._boundary = -1  # offset of the last top-level separator (`{`, `,` or `}`), -1 before the first
        self._in_string = False
        self._escaped = False  # the last chunk ended with a backslash inside a string

    def feed(self, chunk: bytes) -> None:
        offset, self._offset = self._offset, self._offset + len(chunk)
        if not chunk:
            return
        if self._escaped:
            chunk, self._escaped = b"_" + chunk[1:], False
        if b"\\" in chunk:
            chunk = chunk.replace(b"\\\\", b"__")  # escaped backslashes first: then \" is an escaped quote
            if chunk.endswith(b"\\"):
                chunk, self._escaped = chunk[:-1] + b"_", True
            chunk = chunk.replace(b'\\"', b"__")
        if self._in_string and b'"' not in chunk:
            return  # all of it inside one string (a long prompt, say)
        at = np.flatnonzero(np.frombuffer(chunk.translate(_STRUCTURAL), dtype=np.bool_))
        if at.size == 0:
            return
        chars = np.frombuffer(chunk, dtype=np.uint8)[at]
        quotes = chars == _QUOTE[0]
        seen = np.cumsum(quotes, dtype=np.int64)
        outside = (((seen - quotes + self._in_string) & 1) == 0) & ~quotes
        if int(seen[-1]) & 1:
            self._in_string = not self._in_string
        chars, at = chars[outside], at[outside]
        if chars.size == 0:
            return
        opens_objects = int(np.count_nonzero(chars == _OPEN_OBJECT[0]))
        commas = chars == _COMMA[0]
        self.objects += opens_objects
        self.values += (
            int(np.count_nonzero(commas)) + int(np.count_nonzero(chars == _OPEN_ARRAY[0])) + opens_objects
        )
        walk = np.cumsum(_DELTA[chars], dtype=np.int64) + self.depth
        self.max_depth = max(self.max_depth, int(walk.max()))
        self.depth = int(walk[-1])
        if self.member_bytes is None:
            return
        top = ((commas | (chars == _OPEN_OBJECT[0])) & (walk == 1)) | (
            (chars == _CLOSE_OBJECT[0]) & (walk == 0)
        )
        bounds = at[top] + offset
        if bounds.size == 0:
            return
        if self._boundary >= 0:
            bounds = np.concatenate(([self._boundary], bounds))
        big = np.flatnonzero(np.diff(bounds) - 1 > self.member_bytes)
        self.large_members.extend((int(bounds[i]) + 1, int(bounds[i + 1])) for i in big)
        self._boundary = int(bounds[-1])

    def finish(self) -> None:
        """The body ended: a member still open (no closing brace) counts up to the end."""
        if (
            self.member_bytes is not None
            and self._boundary >= 0
            and self._offset - self._boundary - 1 > self.member_bytes
        ):
            self.large_members.append((self._boundary + 1, self._offset))
            self._boundary = self._offset

    def error(self) -> str | None:
        """What exceeds a limit, in words with the limit, or None."""
        if self.max_depth > MAX_JSON_DEPTH:
            return f"the JSON body nests {self.max_depth} levels deep; at most {MAX_JSON_DEPTH} are accepted"
        if self.objects > MAX_JSON_OBJECTS:
            return f"the JSON body holds more than {MAX_JSON_OBJECTS} objects; at most {MAX_JSON_OBJECTS} are accepted"
        if self.values > MAX_JSON_VALUES:
            return f"the JSON body holds more than {MAX_JSON_VALUES} values; at most {MAX_JSON_VALUES} are accepted"
        return None


def member_key(body: bytes, start: int, end: int) -> tuple[str, int] | None:
    """The key of the top-level member `body[start:end]` and the offset where its value begins, or
    None when the span is not `"key": value` (a top-level array's element, say)."""
    head = body[start : min(end, start + 4096)]
    text = head.lstrip()
    if not text.startswith(_QUOTE):
        return None
    close = _blank_escapes(text).find(_QUOTE, 1)
    if close < 0:
        return None
    rest = text[close + 1 :].lstrip()
    if not rest.startswith(b":"):
        return None
    try:
        key = text[1:close].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\\" in key:
        try:
            key = json.loads('"' + key + '"')
        except ValueError:
            return None
    return key, start + (len(head) - len(rest)) + 1


def nonblank_length(text: bytes, *, ascii_only: bool = True) -> int:
    """A lower bound on the characters of `text`'s compact JSON form (json.dumps with separators
    "," and ":"): its bytes less every whitespace byte (inside strings too) and less what an escape
    may save when it is written back (`\\/`; `\\u00XX` of an ASCII character; with ascii_only
    False, every `\\uXXXX` and every UTF-8 continuation byte: characters, not bytes, are counted).
    C-speed counts, no per-byte Python or numpy work."""
    blanks = sum(text.count(c) for c in (b" ", b"\t", b"\n", b"\r"))
    if ascii_only:  # written ASCII-escaped (the grammar cache's key): a non-ASCII character only grows
        return len(text) - blanks - text.count(b"\\/") - 5 * text.count(b"\\u00")
    multibyte = len(text) - len(text.translate(None, _CONTINUATION))
    return len(text) - blanks - text.count(b"\\/") - 5 * text.count(b"\\u") - multibyte
