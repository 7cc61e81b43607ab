"""From a request's structured-output fields to one StructuredSpec, or a 400 naming the field.

Accepted: OpenAI's `response_format` ({"type": "text" | "json_object" | "json_schema"}) and vLLM's
extensions `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` and
`structured_outputs` ({"json" | "regex" | "choice" | "grammar" | "json_object": ...}). At most one
constraint per request.
"""

from __future__ import annotations

import json
from typing import Any

from kvpilot.engine.server.wire.api_error import APIError
from kvpilot.engine.server.wire.request_bodies import SamplingFields
from kvpilot.engine.structured.spec import StructuredSpec

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
STRUCTURED_OUTPUT_KEYS = ("json", "regex", "choice", "grammar", "json_object")
BACKENDS = (None, "auto", "xgrammar")


def structured_spec(req: SamplingFields) -> tuple[StructuredSpec, str] | None:
    """The request's constraint and the field it came from (for error messages), or None."""
    found: list[tuple[StructuredSpec, str]] = []
    fmt = _response_format(req.response_format)
    if fmt is not None:
        found.append((fmt, "response_format"))
    for name in GUIDED_FIELDS:
        value = getattr(req, name)
        if value is not None:
            found.append((_guided(name, value), name))
    if req.structured_outputs is not None:
        found.append((_structured_outputs(req.structured_outputs), "structured_outputs"))
    if req.guided_decoding_backend not in BACKENDS:
        _bad("guided_decoding_backend", f"guided_decoding_backend {req.guided_decoding_backend!r} is not available: "
             "this server compiles grammars with xgrammar; send 'xgrammar', 'auto' or leave it out")  # fmt: skip
    if req.guided_whitespace_pattern is not None:
        _bad("guided_whitespace_pattern", "guided_whitespace_pattern is not supported: JSON output is compact (no "
             "whitespace between tokens); remove it")  # fmt: skip
    if len(found) > 1:
        names = ", ".join(name for _, name in found)
        _bad(found[1][1], f"{names} each constrain the output; send at most one of them")
    return found[0] if found else None


def _response_format(fmt: Any) -> StructuredSpec | None:
    if fmt is None:
        return None
    kinds = "'text', 'json_object' or 'json_schema'"
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        _bad("response_format", f"response_format must be an object with a 'type' of {kinds}, got {fmt!r}")
    kind = fmt["type"]
    if kind == "text":
        _only_keys("response_format", fmt, {"type"})
        return None
    if kind == "json_object":
        _only_keys("response_format", fmt, {"type"})
        return StructuredSpec("json_object")
    if kind != "json_schema":
        _bad("response_format", f"response_format type {kind!r} is not supported; use {kinds}")
    _only_keys("response_format", fmt, {"type", "json_schema"})
    body = fmt.get("json_schema")
    if not isinstance(body, dict):
        _bad("response_format", "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}")
    _only_keys("response_format.json_schema", body, {"name", "schema", "strict", "description"})
    schema = body.get("schema")
    if not isinstance(schema, dict):
        _bad("response_format", f"response_format.json_schema.schema must be a JSON schema object, got {schema!r}")
    return StructuredSpec("json_schema", schema)


def _guided(name: str, value: Any, param: str | None = None) -> StructuredSpec:
    param = param or name
    if name == "guided_json":
        return _json_schema(param, value)
    if name == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            _bad(param, f"{param} must be a non-empty list of non-empty strings, got {value!r}")
        return StructuredSpec("choice", tuple(value))
    if not isinstance(value, str) or not value.strip():
        what = "a regular expression" if name == "guided_regex" else "an EBNF grammar with a `root` rule"
        _bad(param, f"{param} must be {what} (a non-empty string), got {value!r}")
    return StructuredSpec("regex" if name == "guided_regex" else "grammar", value)


def _json_schema(name: str, value: Any) -> StructuredSpec:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except RecursionError:
            _bad(name, f"{name} is a JSON string nested deeper than the parser goes; send a flatter schema")
        except ValueError as exc:
            _bad(name, f"{name} is a string that is not valid JSON ({exc}); send the schema as an object")
    if not isinstance(value, dict):
        _bad(name, f"{name} must be a JSON schema object, got {value!r}")
    return StructuredSpec("json_schema", value)


def _structured_outputs(value: Any) -> StructuredSpec:
    name = "structured_outputs"
    if not isinstance(value, dict):
        _bad(name, f"structured_outputs must be an object with one of {', '.join(STRUCTURED_OUTPUT_KEYS)}")
    present = [k for k, v in value.items() if v is not None and v is not False]
    unknown = [k for k in present if k not in STRUCTURED_OUTPUT_KEYS]
    if unknown:
        _bad(name, f"structured_outputs.{unknown[0]} is not supported; supported: {', '.join(STRUCTURED_OUTPUT_KEYS)}")
    if len(present) != 1:
        _bad(name, f"structured_outputs needs exactly one of {', '.join(STRUCTURED_OUTPUT_KEYS)}, got {present}")
    key = present[0]
    if key == "json_object":
        if value[key] is not True:
            _bad(name, "structured_outputs.json_object must be true")
        return StructuredSpec("json_object")
    if key == "json":
        return _json_schema("structured_outputs.json", value[key])
    guided = {"regex": "guided_regex", "choice": "guided_choice", "grammar": "guided_grammar"}[key]
    return _guided(guided, value[key], f"structured_outputs.{key}")


def _only_keys(param: str, body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        _bad(param, f"{param} has unsupported keys {extra}; allowed: {sorted(allowed)}")


def _bad(param: str, message: str) -> None:
    raise APIError(400, message, param=param, code="invalid_value")
