"""Issue 33 items 6 and 1: a body's JSON values, objects, depth and large top-level members are
found on its raw bytes, chunk by chunk, exactly as the parsed document has them (strings, escapes
and chunk ends included)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.engine.server.http.json_shape import MAX_JSON_DEPTH, JsonShape, member_key, nonblank_length

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


_styles = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 2}, {"indent": "\t", "separators": (" ,", " : ")}])


@settings(max_examples=300, deadline=None)
@given(
    members=st.dictionaries(_text, _json, max_size=5),
    style=_styles,
    ascii_only=st.booleans(),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_top_level_members_are_located_on_the_raw_bytes_however_the_body_is_cut(
    members: dict[str, Any], style: dict[str, Any], ascii_only: bool, cuts: list[int]
) -> None:
    body = json.dumps(members, ensure_ascii=ascii_only, **style).encode()
    shape = JsonShape(member_bytes=0)  # every member that holds a byte
    bounds = sorted({c for c in cuts if 0 < c < len(body)} | {0, len(body)})
    for start, end in itertools.pairwise(bounds):
        shape.feed(body[start:end])
    shape.finish()
    found = []
    for start, end in shape.large_members:
        key = member_key(body, start, end)
        assert key is not None, body[start:end]
        found.append((key[0], json.loads(body[key[1] : end])))
    assert found == list(members.items())


def test_only_members_over_the_size_are_kept_and_an_unclosed_one_counts_to_the_end() -> None:
    body = json.dumps({"prompt": "x" * 100, "guided_json": {"enum": ["a" * 50] * 10}, "n": 1}).encode()
    shape = JsonShape(member_bytes=200)
    shape.feed(body)
    shape.finish()
    assert [member_key(body, *span)[0] for span in shape.large_members] == ["guided_json"]  # type: ignore[index]
    cut = body[: body.index(b', "n"')]  # the body ends inside guided_json: its member runs to the end
    open_shape = JsonShape(member_bytes=200)
    open_shape.feed(cut)
    open_shape.finish()
    assert open_shape.large_members == [(body.index(b' "guided_json"'), len(cut))]


@settings(max_examples=300, deadline=None)
@given(value=_json, style=_styles, ascii_only=st.booleans())
def test_nonblank_length_never_exceeds_the_compact_form_the_later_checks_count(
    value: Any, style: dict[str, Any], ascii_only: bool
) -> None:
    sent = json.dumps(value, ensure_ascii=ascii_only, **style).encode()
    assert nonblank_length(sent) <= len(json.dumps(value, separators=(",", ":")))  # the grammar cache's key
    assert nonblank_length(sent, ascii_only=False) <= len(json.dumps(value, ensure_ascii=False))  # tools_chars


def test_a_cut_anywhere_leaves_every_offset_in_place() -> None:
    body = json.dumps({"a\\\"": 'x\\"y\\\\', "b": ["\n", "\u00e9", {"c": "\\"}], "d": "]}\\\\\""}).encode()
    whole = JsonShape(member_bytes=0)
    whole.feed(body)
    whole.finish()
    assert len(whole.large_members) == 3
    for cut in range(1, len(body)):
        shape = JsonShape(member_bytes=0)
        shape.feed(body[:cut])
        shape.feed(body[cut:])
        shape.finish()
        assert shape.large_members == whole.large_members, cut
