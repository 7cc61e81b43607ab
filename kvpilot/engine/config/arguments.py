"""`kvpilot serve`'s engine flags, derived from EngineConfig's fields (those made with `knob`).

As vLLM's `arg_utils` does: each field with `help` metadata becomes `--field-name` (or its `flag`),
typed from the annotation, with the field's default; a bool that defaults to True gets `--no-...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from kvpilot.engine.config.engine import EngineConfig

_SCALARS = (int, float, str)


def cli_fields(cls: type = EngineConfig) -> list[dataclasses.Field]:
    """The dataclass fields that are flags, in declaration order."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def _scalar(annotation: Any, owner: str, name: str) -> type:
    """int, float, str or bool from `T` or `T | None`; anything else is not a flag."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if len(options) == 1 and (options[0] in _SCALARS or options[0] is bool):
        return options[0]
    raise TypeError(f"{owner}.{name}: a flag needs an int, float, str or bool field, not {annotation}")


def add_config_arguments(group: argparse._ActionsContainer, cls: type = EngineConfig) -> None:
    """Add one flag per knob of `cls` to the parser or argument group."""
    hints = typing.get_type_hints(cls)
    for f in cli_fields(cls):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        kind = _scalar(hints[f.name], cls.__name__, f.name)
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": f.metadata["help"]}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if f.default else "store_true"
        elif kind is not str:
            kwargs["type"] = kind
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        group.add_argument(flag, **kwargs)


def config_kwargs(args: argparse.Namespace, cls: type = EngineConfig) -> dict[str, Any]:
    """The parsed knobs as keyword arguments for `cls`."""
    return {f.name: getattr(args, f.name) for f in cli_fields(cls)}
