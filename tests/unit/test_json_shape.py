"""Issue 33 item 6: a body's JSON values, objects and depth are counted on its raw bytes, chunk by
chunk, exactly as the parsed document has them (strings, escapes and chunk ends included)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.engine.server.json_shape import MAX_JSON_DEPTH, JsonShape

pytestmark = pytest.mark.unit

_text = st.text(alphabet=st.sampled_from(list('ab,[]{}":\\\n\u00e9')), max_size=8)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=30,
)


def reference(value: Any, depth: int = 0) -> tuple[int, int, int]:
    """(values, objects, depth) as JsonShape counts them: each container counts max(1, its items)."""
    if isinstance(value, (list, dict)):
        items = list(value.values()) if isinstance(value, dict) else value
        counts = [reference(v, depth + 1) for v in items]
        return (
            max(1, len(items)) + sum(c[0] for c in counts),
            int(isinstance(value, dict)) + sum(c[1] for c in counts),
            max([depth + 1] + [c[2] for c in counts]),
        )
    return 0, 0, depth


@settings(max_examples=300, deadline=None)
@given(value=_json, cuts=st.lists(st.integers(0, 400), max_size=8), ascii_only=st.booleans())
def test_counts_match_the_parsed_document_however_the_body_is_cut(value: Any, cuts: list[int], ascii_only: bool) -> None:
    body = json.dumps({"model": "m", "x": value}, ensure_ascii=ascii_only).encode()
    shape = JsonShape()
    bounds = sorted({c for c in cuts if 0 < c < len(body)} | {0, len(body)})
    for start, end in itertools.pairwise(bounds):
        shape.feed(body[start:end])
    values, objects, depth = reference({"model": "m", "x": value})
    assert (shape.values, shape.objects, shape.max_depth) == (values, objects, depth)


def test_limits_are_named_in_words() -> None:
    deep = JsonShape()
    deep.feed(b"[" * (MAX_JSON_DEPTH + 1))
    assert deep.error() == f"the JSON body nests {MAX_JSON_DEPTH + 1} levels deep; at most {MAX_JSON_DEPTH} are accepted"
    many = JsonShape()
    many.feed(json.dumps({"messages": [{"role": "user", "content": ""}] * 10_001}).encode())
    assert "more than 10000 objects" in (many.error() or "")
    fine = JsonShape()
    fine.feed(json.dumps({"prompt": "[[[[{{{{,,,," * 10_000, "stop": ["\\\"[", "]"]}).encode())
    assert fine.error() is None and fine.max_depth == 2 and fine.values == 4
