"""How many JSON values and objects a body holds, and how deep it nests, counted on the raw bytes
as they arrive, before any of it is parsed.

Parsing and validating a body holds the GIL (json.loads and pydantic are C code that never
releases it), so a thread would not keep the event loop free: a body of 200,000 small messages
stalled it for seconds. Counting is cheap bytes work (split, count, translate, one cumsum) per
chunk, so a body is refused as soon as it holds more than the limits, and the bodies that pass
parse in bounded time.

Counts are exact for valid JSON outside strings: a value is counted at each comma and each opening
bracket (values = commas + containers), escapes inside strings are skipped, and a chunk may end
anywhere (inside a string, after a backslash).
"""

from __future__ import annotations

import numpy as np

MAX_JSON_DEPTH = 64
MAX_JSON_VALUES = 200_000  # e.g. one prompt of 200k token ids, or 64 of 3k each
MAX_JSON_OBJECTS = 10_000  # objects are what costs (a pydantic model each): 4096 messages and their tools

_OPEN_CLOSE = bytes.maketrans(b"[]{}", bytes([1, 255, 1, 255]))  # int8: +1 opens, -1 closes
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JsonShape:
    """Fed a body chunk by chunk: `values`, `objects` and `max_depth` so far."""

    def __init__(self) -> None:
        self.values = 0
        self.objects = 0
        self.depth = 0
        self.max_depth = 0
        self._in_string = False
        self._escaped = False  # the last chunk ended with a backslash inside a string

    def feed(self, chunk: bytes) -> None:
        if self._escaped and chunk:
            chunk, self._escaped = chunk[1:], False
        if b"\\" in chunk:
            chunk = chunk.replace(b"\\\\", b"__")  # escaped backslashes first: then \" is an escaped quote
            if chunk.endswith(b"\\"):
                chunk, self._escaped = chunk[:-1], True
            chunk = chunk.replace(b'\\"', b"__")
        if b'"' in chunk:
            parts = chunk.split(b'"')
            outside = b"".join(parts[1 if self._in_string else 0 :: 2])
            if len(parts) % 2 == 0:
                self._in_string = not self._in_string
        elif self._in_string:
            return
        else:
            outside = chunk
        opens_objects = outside.count(b"{")
        self.objects += opens_objects
        self.values += outside.count(b",") + outside.count(b"[") + opens_objects
        brackets = outside.translate(_OPEN_CLOSE, _NOT_BRACKETS)
        if brackets:
            walk = np.cumsum(np.frombuffer(brackets, dtype=np.int8), dtype=np.int64) + self.depth
            self.max_depth = max(self.max_depth, int(walk.max()))
            self.depth = int(walk[-1])

    def error(self) -> str | None:
        """What exceeds a limit, in words with the limit, or None."""
        if self.max_depth > MAX_JSON_DEPTH:
            return f"the JSON body nests {self.max_depth} levels deep; at most {MAX_JSON_DEPTH} are accepted"
        if self.objects > MAX_JSON_OBJECTS:
            return f"the JSON body holds more than {MAX_JSON_OBJECTS} objects; at most {MAX_JSON_OBJECTS} are accepted"
        if self.values > MAX_JSON_VALUES:
            return f"the JSON body holds more than {MAX_JSON_VALUES} values; at most {MAX_JSON_VALUES} are accepted"
        return None
