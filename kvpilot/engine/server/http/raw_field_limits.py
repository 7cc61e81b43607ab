"""Output constraints and tools over their size limit, refused from the body's raw bytes before
the body is parsed.

A 50,000-value enum is 0.7 MB of JSON, over the compiler's limit on a constraint's text; refused
only after json.loads, pydantic and serialising it for the grammar cache's key, each such body held
the GIL for 60-150 ms, and sixteen of them took `/health` past a second. The request guard's scan
(json_shape.py) already records where the body's large top-level members lie; this module names
the fields that have a size limit, measures those members (nonblank_length: a lower bound on
the compact JSON the later checks count, so nothing they would accept is refused here) and
refuses one over its limit with the 400 the later check would give, naming the field and the
limit. What passes is at most the limit's worth of JSON, which parses in bounded time.
"""

from __future__ import annotations

from kvpilot.engine.server.http.json_shape import member_key, nonblank_length
from kvpilot.engine.server.wire.api_error import APIError
from kvpilot.engine.server.wire.request_limits import MAX_TOOLS_CHARS
from kvpilot.engine.structured.compiler import MAX_SPEC_CHARS

CONSTRAINT_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                     "structured_outputs")  # fmt: skip
_CONSTRAINTS = {name: (name, MAX_SPEC_CHARS) for name in CONSTRAINT_FIELDS}
_TOOLS = {"tools": ("tools", MAX_TOOLS_CHARS)}  # counted as json.dumps(ensure_ascii=False) writes them
# route -> top-level key -> (the param an error names, the most characters of JSON it may hold)
ROUTE_FIELDS: dict[str, dict[str, tuple[str, int]]] = {
    "/v1/completions": _CONSTRAINTS,
    "/v1/chat/completions": {**_CONSTRAINTS, **_TOOLS},
    "/v1/responses": {"text": ("text.format", MAX_SPEC_CHARS), **_TOOLS},
}
SMALLEST_LIMIT = min(limit for fields in ROUTE_FIELDS.values() for _, limit in fields.values())


def oversized_field(path: str, body: bytes, large_members: list[tuple[int, int]]) -> APIError | None:
    """The 400 for the first size-limited field of `path` whose member in `body` is over its limit, or None.

    `large_members` are the (start, end) spans of the top-level members longer than SMALLEST_LIMIT
    bytes (JsonShape(member_bytes=SMALLEST_LIMIT).large_members)."""
    fields = ROUTE_FIELDS.get(path)
    if not fields:
        return None
    for start, end in large_members:
        found = member_key(body, start, end)
        if found is None or found[0] not in fields:
            continue
        param, limit = fields[found[0]]
        text = body[found[1] : end]
        chars = nonblank_length(text, ascii_only=param != "tools") if len(text) > limit else 0
        if chars > limit:
            return _refusal(param, chars, limit)
    return None


def _refusal(param: str, chars: int, limit: int) -> APIError:
    if param == "tools":
        return APIError(
            400,
            f"the tools' definitions hold at least {chars} characters of JSON (whitespace not counted); at most "
            f"{limit} are accepted (the chat template renders them all into the prompt): shorten their descriptions "
            "and schemas, or send fewer tools",
            param=param,
            code="too_many_items",
        )
    return APIError(
        400,
        f"{param} holds at least {chars} characters of JSON (whitespace not counted); this server compiles "
        f"constraints of at most {limit} characters: simplify it or shorten its enums",
        param=param,
        code="invalid_value",
    )
