"""Issue 33 item 1's open case: an output constraint (or tools) over its size limit is refused from
the body's raw bytes, naming the field and the limit, and what the later checks would accept is not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvpilot.engine.server.http.json_shape import JsonShape
from kvpilot.engine.server.http.raw_field_limits import SMALLEST_LIMIT, oversized_field
from kvpilot.engine.server.wire.request_limits import MAX_TOOLS_CHARS
from kvpilot.engine.structured.compiler import MAX_SPEC_CHARS

pytestmark = pytest.mark.unit

ENUM = {"enum": [f"v-{i}" for i in range(50_000)]}  # 0.5 MB: over the 128 Ki-character limit


def _refusal(path: str, body: dict[str, Any], **dump: Any) -> Any:
    raw = json.dumps(body, **dump).encode()
    shape = JsonShape(member_bytes=SMALLEST_LIMIT)
    for at in range(0, len(raw), 65536):
        shape.feed(raw[at : at + 65536])
    shape.finish()
    return oversized_field(path, raw, shape.large_members)


@pytest.mark.parametrize(
    ("path", "field", "value", "param"),
    [
        ("/v1/completions", "guided_json", ENUM, "guided_json"),
        ("/v1/completions", "guided_json", json.dumps(ENUM), "guided_json"),  # a schema given as a string
        ("/v1/completions", "guided_choice", ENUM["enum"], "guided_choice"),
        ("/v1/completions", "guided_regex", "|".join(ENUM["enum"]), "guided_regex"),
        ("/v1/chat/completions", "response_format",
         {"type": "json_schema", "json_schema": {"name": "x", "schema": ENUM}}, "response_format"),
        ("/v1/chat/completions", "structured_outputs", {"json": ENUM}, "structured_outputs"),
        ("/v1/responses", "text", {"format": {"type": "json_schema", "name": "x", "schema": ENUM}}, "text.format"),
    ],
)  # fmt: skip
def test_an_oversize_constraint_is_refused_naming_the_field_and_the_limit(
    path: str, field: str, value: Any, param: str
) -> None:
    error = _refusal(path, {"model": "m", "prompt": "hi", field: value, "max_tokens": 4})
    assert error is not None and error.status == 400
    assert error.param == param and error.code == "invalid_value"
    assert error.message.startswith(f"{param} holds at least ")
    assert f"constraints of at most {MAX_SPEC_CHARS} characters" in error.message


def test_tools_over_their_limit_are_refused_as_the_later_check_words_it() -> None:
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 600_000}}
    error = _refusal("/v1/chat/completions", {"messages": [], "tools": [tool]})
    assert error is not None and error.param == "tools" and error.code == "too_many_items"
    assert f"at most {MAX_TOOLS_CHARS} are accepted" in error.message
    cjk = {"type": "function", "function": {"name": "f", "description": "\u4e2d" * 200_000}}  # 1.2 MB escaped
    assert _refusal("/v1/chat/completions", {"messages": [], "tools": [cjk]}) is None  # 200k characters: fine


def test_what_the_later_checks_accept_passes() -> None:
    nine_thousand = {"enum": [f"v-{i}" for i in range(9000)]}
    assert _refusal("/v1/completions", {"prompt": "hi", "guided_json": nine_thousand}) is None
    indented = {
        "prompt": "hi",
        "guided_json": nine_thousand,
    }  # 305 KB with indent=8: over the limit only in blanks
    assert _refusal("/v1/completions", indented, indent=8) is None
    assert (
        _refusal("/v1/completions", {"prompt": list(range(200_000))}) is None
    )  # 1.3 MB, but not a constraint
    assert _refusal("/tokenize", {"prompt": "hi", "guided_json": ENUM}) is None  # a route without constraints
    assert _refusal("/v1/completions", {"prompt": "hi", "guided_jsonx": ENUM}) is None  # no such field
