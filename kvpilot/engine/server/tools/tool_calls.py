"""Tool calling on chat completions: what the request asks (tools + tool_choice), how the output is
constrained (tool_choice "required" or a named function: a JSON schema through structured output),
and how the generated text becomes OpenAI `tool_calls`, whole or streamed.

- "none": tools are rendered by the chat template; the output is plain content.
- "auto" (the default with tools): unconstrained; the output is parsed in the model's own format
  (tool_parsers.py: hermes or llama3_json), chosen by --tool-call-parser or from the template.
- "required": the output is a JSON array of {"name", "arguments"} objects, one of the offered tools
  each (at most one with parallel_tool_calls=false).
- {"type": "function", "function": {"name": X}}: the output is X's arguments object.

Whole and streamed answers agree: a `required` array cut by max_tokens gives the calls whose names
were complete, the last with its arguments as far as they got (finish "length"), both ways. With
ignore_eos the output runs on past the constraint's end (as in vLLM): that free text is the content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvpilot.engine.server.tools.tool_call_scanner import CallArrayScanner, ValueEnd
from kvpilot.engine.server.tools.tool_parsers import (
    HERMES_OPEN,
    PYTHON_TAG,
    ParsedCall,
    held_back,
    hermes_closed_calls,
    new_call_id,
    parse_tool_calls,
)
from kvpilot.engine.server.wire.api_error import APIError
from kvpilot.engine.structured.spec import StructuredSpec

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class ToolPlan:
    mode: str  # none | auto | required | named
    tools: list[dict[str, Any]]  # OpenAI tool objects, as the chat template receives them
    parser: str | None = None  # auto only
    named: str | None = None
    parallel: bool = True
    names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.names = {t["function"]["name"] for t in self.tools}

    def spec(self) -> StructuredSpec | None:
        """The constraint tool_choice puts on the output (required / named), else None."""
        params = {t["function"]["name"]: t["function"].get("parameters") or ANY_OBJECT for t in self.tools}
        if self.mode == "named":
            assert self.named is not None
            return StructuredSpec("json_schema", params[self.named])
        if self.mode != "required":
            return None
        items = [
            {"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
             "required": ["name", "arguments"], "additionalProperties": False}
            for name, schema in params.items()
        ]  # fmt: skip
        array: dict[str, Any] = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items},
                                 "minItems": 1}  # fmt: skip
        if not self.parallel:
            array["maxItems"] = 1
        return StructuredSpec("json_schema", array)

    def message(self, text: str, finish_reason: str | None) -> tuple[str | None, list[dict[str, Any]] | None, str | None]:
        """(content, tool_calls, finish_reason) of a whole choice."""
        if self.mode == "named":  # OpenAI: "stop" for a forced function
            end = ValueEnd().feed(text)
            args, rest = (text, "") if end is None else (text[:end], text[end:])
            return _free_text(rest), [ParsedCall(self.named or "", args).wire()], finish_reason
        if self.mode == "required":
            scanner = CallArrayScanner()
            scanner.feed(text)
            found = [ParsedCall(c.name, scanner.arguments(c)) for c in scanner.calls if c.name is not None]
            if not found:  # cut before the first call's name: there is no call to return
                return text, None, finish_reason
            rest = text[scanner.end :] if scanner.end is not None else ""
            return _free_text(rest), [c.wire() for c in found], "tool_calls" if finish_reason == "stop" else \
                finish_reason  # fmt: skip
        calls = self._calls(text)
        if not calls:
            return text, None, finish_reason
        return self._content_before(text), [c.wire() for c in calls], \
            "tool_calls" if finish_reason == "stop" else finish_reason  # fmt: skip

    def _calls(self, text: str) -> list[ParsedCall]:
        if self.mode == "auto" and self.parser is not None:
            calls = parse_tool_calls(self.parser, text, self.names)[1]
            return calls if self.parallel else calls[:1]
        return []

    def _content_before(self, text: str) -> str | None:
        assert self.parser is not None
        return parse_tool_calls(self.parser, text, self.names)[0]

    def streamer(self) -> ToolStream:
        return ToolStream(self)


class ToolStream:
    """Turns one choice's streamed text into chat deltas: content, or tool_calls deltas.

    A named function's output is its arguments: they stream as generated. `required` output is a
    JSON array of calls: each call goes out once its name is complete and its arguments stream as
    they grow (tool_call_scanner.py). `auto` (hermes): content streams until `<tool_call>`, then
    each call goes out whole when its `</tool_call>` closes it (only a closed block is known to be
    a valid call); llama3_json: the output is the calls, sent at the end.
    """

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""  # everything generated so far
        self.sent = 0  # characters of `text` already sent as content
        self.buffering = plan.mode == "required"
        self.named_id = new_call_id() if plan.mode == "named" else ""
        self.opened = False  # named: the delta with the call's id and name went out
        self.value_end = ValueEnd() if plan.mode == "named" else None
        self.args_sent = 0  # named: characters of `text` already sent as arguments
        self.scanner = CallArrayScanner() if plan.mode == "required" else None
        self.call_ids: list[str] = []  # required: the ids of the calls opened so far
        self.calls_sent = 0  # auto (hermes): calls already sent whole

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        plan = self.plan
        if self.value_end is not None:  # named: the output is the arguments: stream them as they come
            end = self.value_end.feed(piece)
            upto = end if end is not None else len(self.text)
            args, self.args_sent = self.text[self.args_sent : upto], max(self.args_sent, upto)
            deltas: list[dict[str, Any]] = []
            if not self.opened:
                self.opened = True
                deltas.append({"tool_calls": [{"index": 0, "id": self.named_id, "type": "function",
                                               "function": {"name": plan.named, "arguments": args}}]})  # fmt: skip
            elif args:
                deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": args}}]})
            return deltas + (self._free_after(end) if end is not None else [])
        if self.scanner is not None:
            return self._required(piece)
        if self.buffering and plan.mode == "auto" and plan.parser == "hermes":
            return self._calls([c.wire() for c in hermes_closed_calls(self.text, plan.names)])
        if self.buffering or plan.mode == "none" or plan.parser is None:
            return self._content(len(self.text)) if not self.buffering else []
        if plan.parser == "hermes":
            at = self.text.find(HERMES_OPEN, max(0, self.sent - len(HERMES_OPEN)))
            if at >= 0:
                self.buffering = True
                return self._content(at) + self._calls([c.wire() for c in hermes_closed_calls(self.text, plan.names)])
            return self._content(len(self.text) - held_back(self.text, HERMES_OPEN))
        head = self.text.lstrip()  # llama3_json: a call is the whole output, so decide on its start
        if not head or PYTHON_TAG.startswith(head):
            return []
        if head.startswith(("{", PYTHON_TAG)):
            self.buffering = True
            return []
        return self._content(len(self.text))

    def finish(self, finish_reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """The last deltas and the choice's finish reason."""
        if self.plan.mode == "named":
            return ([] if self.opened else self.feed("")), finish_reason
        if self.call_ids:  # required, calls already streamed (a cut-off one ends with finish "length")
            return [], "tool_calls" if finish_reason == "stop" else finish_reason
        _, calls, reason = self.plan.message(self.text, finish_reason)
        if not calls:
            return self._content(len(self.text)), finish_reason
        return self._calls(calls), reason

    def _required(self, piece: str) -> list[dict[str, Any]]:
        assert self.scanner is not None
        deltas = []
        for event in self.scanner.feed(piece):
            if event.name is not None:
                self.call_ids.append(new_call_id())
                call = {"index": event.index, "id": self.call_ids[event.index], "type": "function",
                        "function": {"name": event.name, "arguments": event.arguments}}  # fmt: skip
            else:
                call = {"index": event.index, "function": {"arguments": event.arguments}}
            deltas.append({"tool_calls": [call]})
        return deltas + (self._free_after(self.scanner.end) if self.scanner.end is not None else [])

    def _free_after(self, end: int) -> list[dict[str, Any]]:
        """What ignore_eos generated past the constraint's end, as content (once it is more than spaces,
        as the whole answer's content)."""
        self.sent = max(self.sent, end)
        return self._content(len(self.text)) if self.text[end:].strip() else []

    def _calls(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Whole calls not sent yet (at most one without parallel_tool_calls), one delta each."""
        limit = len(calls) if self.plan.parallel else min(len(calls), 1)
        deltas = [{"tool_calls": [{"index": i, **calls[i]}]} for i in range(self.calls_sent, limit)]
        self.calls_sent = max(self.calls_sent, limit)
        return deltas

    def _content(self, upto: int) -> list[dict[str, Any]]:
        if upto <= self.sent:
            return []
        piece, self.sent = self.text[self.sent : upto], upto
        return [{"content": piece}]


def tool_plan(req: Any, parser: str | None, template: str | None) -> ToolPlan | None:
    """The request's ToolPlan, or None without tools; a 400 naming the field for what cannot be served."""
    choice = req.tool_choice
    if not req.tools:
        if choice is not None and choice != "none":
            _bad("tool_choice", f"tool_choice {_show(choice)} needs tools; send tools or leave tool_choice out")
        return None
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    names = [t["function"]["name"] for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        _bad("tools", f"tool names must be unique; {dupes} appear more than once")
    if not template or "tools" not in template:
        _bad("tools", "this model's chat template does not render `tools`, so the model would never see them; "
             "serve it with --chat-template FILE whose template renders tools")  # fmt: skip
    parallel = req.parallel_tool_calls is not False
    if choice is None or choice == "auto":
        if parser is None:
            _bad("tool_choice", "tool_choice 'auto' needs a tool-call parser and this model's chat template shows no "
                 "format kvpilot knows; start the server with --tool-call-parser hermes|llama3_json, or send "
                 "tool_choice 'required' or a named function (those constrain the output instead)")  # fmt: skip
        return ToolPlan("auto", tools, parser=parser, parallel=parallel)
    if choice in ("none", "required"):
        return ToolPlan(choice, tools, parallel=parallel)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            _bad("tool_choice", f"tool_choice names function {name!r}, which is not among the tools {names}")
        return ToolPlan("named", tools, named=name, parallel=parallel)
    _bad("tool_choice", f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
         f"{{'name': ...}}}}, got {_show(choice)}")  # fmt: skip
    raise AssertionError  # unreachable: _bad raises


def _free_text(rest: str) -> str | None:
    return rest if rest.strip() else None


def _show(value: Any) -> str:
    return json.dumps(value)[:200]


def _bad(param: str, message: str) -> None:
    raise APIError(400, message, param=param, code="invalid_value")
