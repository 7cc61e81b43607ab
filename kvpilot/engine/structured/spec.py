"""What a request constrains its output to. Plain data: no torch, no xgrammar."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredSpec:
    """One constraint on a whole completion.

    kind: json_schema (value: the schema, a dict), json_object (value: None; any JSON object),
    regex (value: the pattern), choice (value: a tuple of strings, the output is exactly one),
    grammar (value: an EBNF grammar as xgrammar reads it, with a `root` rule).
    """

    kind: str
    value: Any = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        ok = {
            "json_schema": isinstance(self.value, dict),
            "json_object": self.value is None,
            "regex": isinstance(self.value, str) and bool(self.value),
            "choice": isinstance(self.value, tuple) and bool(self.value)
            and all(isinstance(c, str) and c for c in self.value),
            "grammar": isinstance(self.value, str) and bool(self.value.strip()),
        }[self.kind]  # fmt: skip
        if not ok:
            expected = {
                "json_schema": "a JSON schema object",
                "json_object": "no value",
                "regex": "a non-empty pattern string",
                "choice": "a non-empty list of non-empty strings",
                "grammar": "a non-empty EBNF grammar string",
            }[self.kind]
            raise ValueError(f"structured output {self.kind} takes {expected}, got {self.value!r}")

    @cached_property
    def key(self) -> str:
        """The same constraint always gives the same key (the compiled-grammar cache's key); computed
        once per spec (a 50k-value enum takes tens of milliseconds to serialise)."""
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return self.kind + ":" + json.dumps(value, sort_keys=True, separators=(",", ":"))
