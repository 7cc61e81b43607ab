"""Streams tool calls out of `tool_choice: "required"` output while it is generated.

That output is a JSON array of `{"name": ..., "arguments": {...}}` objects (structured output
guarantees it), so a call can go out as soon as its name is complete, and its arguments as their
text grows: the scanner follows the JSON character by character (depth, strings, escapes, keys at
item level) and reports, per item, the name once known and the raw text of the `arguments` value
as it arrives. The concatenated argument pieces of an item are exactly that value's JSON text, as
vLLM and OpenAI stream them. The scan stops where the array closes: what follows is free text
(ignore_eos runs the generation on past the grammar's end). Pure: no engine, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_ITEM_DEPTH = 2  # [ {  <- keys of a call object live here


@dataclass
class ScannedCall:
    name: str | None = None
    args_start: int | None = None  # index in the text where the arguments value begins
    args_end: int | None = None  # one past its end, once the value is complete
    args_sent: int = 0  # index up to which the arguments text has been reported
    opened: bool = False  # the call's header (id, name) has been reported


@dataclass
class CallEvent:
    index: int
    name: str | None  # set on the call's first event only
    arguments: str  # the next piece of the arguments' JSON text (may be "")


class CallArrayScanner:
    """Feed the generated text piece by piece; get back what can be streamed of each call."""

    def __init__(self) -> None:
        self.text = ""
        self.calls: list[ScannedCall] = []
        self._pos = 0
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._str_start = 0
        self._expect_key = False
        self._key: str | None = None
        self._value_start: int | None = None  # index of the current item-level value's first char
        self._awaiting_value = False  # after ':' at item level, before the value's first char
        self.end: int | None = None  # one past the array's closing ']', once it has closed

    def feed(self, piece: str) -> list[CallEvent]:
        self.text += piece
        while self._pos < len(self.text) and self.end is None:
            self._step(self.text[self._pos], self._pos)
            self._pos += 1
        return self._events()

    def _step(self, ch: str, i: int) -> None:
        if self._in_str:
            if self._esc:
                self._esc = False
            elif ch == "\\":
                self._esc = True
            elif ch == '"':
                self._in_str = False
                if self._depth == _ITEM_DEPTH:
                    self._string_closed(i)
            return
        if self._awaiting_value and not ch.isspace():
            self._awaiting_value = False
            self._value_start = i
            if self._key == "arguments" and self.calls:
                self.calls[-1].args_start = self.calls[-1].args_sent = i
        if ch == '"':
            self._in_str, self._str_start = True, i
        elif ch in "{[":
            self._depth += 1
            if self._depth == _ITEM_DEPTH and ch == "{":
                self.calls.append(ScannedCall())
                self._expect_key, self._key = True, None
        elif ch in "}]":
            if self._depth == _ITEM_DEPTH:
                self._value_closed(i)  # a primitive value ends at the item's closing brace
                self._key = None
            self._depth -= 1
            if self._depth == _ITEM_DEPTH:  # an object/array value inside the item just closed
                self._value_closed(i + 1)
            elif self._depth == 0:
                self.end = i + 1
        elif ch == "," and self._depth == _ITEM_DEPTH:
            self._value_closed(i)
            self._expect_key, self._key = True, None
        elif ch == ":" and self._depth == _ITEM_DEPTH:
            self._awaiting_value = True

    def _string_closed(self, i: int) -> None:
        raw = self.text[self._str_start : i + 1]
        if self._expect_key:
            self._key, self._expect_key = json.loads(raw), False
        elif self._value_start == self._str_start:
            self._value_closed(i + 1)

    def _value_closed(self, end: int) -> None:
        start = self._value_start
        if start is None or not self.calls:
            return
        self._value_start = None
        value = self.text[start:end].rstrip()
        call = self.calls[-1]
        if self._key == "name":
            name = json.loads(value)
            call.name = name if isinstance(name, str) else json.dumps(name)
        elif self._key == "arguments":
            call.args_end = start + len(value)

    def arguments(self, call: ScannedCall) -> str:
        """The call's arguments text so far (all of it once the value has closed)."""
        if call.args_start is None:
            return ""
        return self.text[call.args_start : call.args_end if call.args_end is not None else len(self.text)]

    def _events(self) -> list[CallEvent]:
        events = []
        for index, call in enumerate(self.calls):
            if call.name is None:
                continue  # the header needs the name; arguments before it are held until then
            piece = ""
            if call.args_start is not None:
                upto = call.args_end if call.args_end is not None else len(self.text)
                piece, call.args_sent = self.text[call.args_sent : upto], max(call.args_sent, upto)
            if not call.opened:
                call.opened = True
                events.append(CallEvent(index, call.name, piece))
            elif piece:
                events.append(CallEvent(index, None, piece))
        return events


class ValueEnd:
    """Where a growing text's first JSON object or array closes (None until it has): a named
    function's arguments end there, and what ignore_eos generates after them is free text."""

    def __init__(self) -> None:
        self.text = ""
        self.end: int | None = None
        self._depth = 0
        self._in_str = False
        self._esc = False

    def feed(self, piece: str) -> int | None:
        start = len(self.text)
        self.text += piece
        for i in range(start, len(self.text)):
            if self.end is not None:
                break
            ch = self.text[i]
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.end = i + 1
        return self.end
