"""Tool calls in a model's own output format, parsed into OpenAI's shape.

- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call (Hermes,
  Qwen2/2.5/3 and other templates that render `<tool_call>`); the text before the first block is
  the message content.
- llama3_json: the whole output is `{"name": ..., "parameters": {...}}` (Llama 3.1/3.2's JSON tool
  calling), optionally after `<|python_tag|>`, several separated by `;`.
Pure functions, no engine.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

PARSERS = ("hermes", "llama3_json")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_HERMES_CLOSED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text of the arguments object, as OpenAI returns it
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = new_call_id()

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def detect_parser(chat_template: str | None) -> str | None:
    """The parser for a chat template's tool-call format, or None when it shows none we know."""
    if not chat_template:
        return None
    if HERMES_OPEN in chat_template:
        return "hermes"
    if PYTHON_TAG in chat_template or '"parameters": ' in chat_template:
        return "llama3_json"
    return None


def parse_tool_calls(parser: str, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls). A block that is not JSON, or names a tool not offered, stays in the content."""
    if parser == "hermes":
        return _parse_hermes(text, names)
    if parser == "llama3_json":
        return _parse_llama3(text, names)
    raise ValueError(f"unknown tool-call parser {parser!r}; known: {', '.join(PARSERS)}")


def _parse_hermes(text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return text, []
    calls = [c for c in (_call(m.group(1), names, "arguments") for m in _HERMES_BLOCK.finditer(text, start)) if c]
    if not calls:
        return text, []
    content = text[:start].strip()
    return content or None, calls


def hermes_closed_calls(text: str, names: set[str]) -> list[ParsedCall]:
    """The valid calls among the hermes blocks already closed by `</tool_call>` (streaming: each goes
    out when it closes; the final parse adds a last block cut off by the end of the output)."""
    start = text.find(HERMES_OPEN)
    if start < 0:
        return []
    return [c for c in (_call(m.group(1), names, "arguments") for m in _HERMES_CLOSED.finditer(text, start)) if c]


def _parse_llama3(text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        return text, []
    calls = []
    for part in _split_objects(body):
        call = _call(part, names, "parameters")
        if call is None:
            return text, []
        calls.append(call)
    return (None, calls) if calls else (text, [])


def _split_objects(body: str) -> list[str]:
    """`{...}; {...}` -> each object's text (JSON decoding finds where each ends)."""
    decoder, parts, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            _, end = decoder.raw_decode(body, at)
        except ValueError:
            return [body]  # not JSON: _call refuses it
        parts.append(body[at:end])
        at = end
        while at < len(body) and body[at] in " \t\r\n;":
            at += 1
    return parts


def _call(raw: str, names: set[str], key: str) -> ParsedCall | None:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get(key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models emit the arguments as JSON text already
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def held_back(text: str, marker: str) -> int:
    """How many trailing characters of `text` could be the start of `marker` (kept back while streaming)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
