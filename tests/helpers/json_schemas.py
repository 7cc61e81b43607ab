"""A seeded generator of JSON schemas whose every instance is short: strings, arrays and numbers are
bounded, so a random model under a grammar mask ends within a few hundred tokens. Each schema uses
only keywords xgrammar enforces (type, properties, required, enum, const, minimum/maximum,
minLength/maxLength, pattern, minItems/maxItems, anyOf, nested objects and arrays)."""

from __future__ import annotations

import random
from typing import Any


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """One object schema with 1-4 properties, some required, nested at most two levels."""
    names = rng.sample(["id", "name", "tags", "score", "ok", "kind", "items", "meta", "n", "note"], rng.randint(1, 4))
    props = {name: _value(rng, depth + 1) for name in names}
    required = [n for n in names if rng.random() < 0.6]
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _value(rng: random.Random, depth: int) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "enum", "const", "pattern", "null", "anyOf"]
    if depth < 3:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "string":
        low = rng.randint(0, 3)
        return {"type": "string", "minLength": low, "maxLength": low + rng.randint(0, 6)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": 10}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2.5, None, True], rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["fixed", 7, False])}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[a-z]{1,5}$", "^[0-9]{3}-[0-9]{2}$", "^(yes|no)$"])}
    if kind == "null":
        return {"type": "null"}
    if kind == "anyOf":
        return {"anyOf": [_value(rng, 3), _value(rng, 3)]}
    if kind == "object":
        return random_schema(rng, depth)
    low = rng.randint(0, 2)
    return {"type": "array", "items": _value(rng, depth + 1), "minItems": low, "maxItems": low + rng.randint(0, 2)}
