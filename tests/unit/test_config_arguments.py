"""`kvpilot serve`'s engine flags come from EngineConfig's fields: added once, typed, defaulted."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.config.arguments import add_config_arguments, cli_fields, config_kwargs
from kvpilot.engine.config.engine import knob
from kvpilot.engine.server.cli import add_arguments

pytestmark = pytest.mark.unit


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_every_knob_is_a_serve_flag_with_the_fields_default():
    args = _parser().parse_args(["--model", "m"])
    defaults = EngineConfig(model="m")
    for f in cli_fields():
        assert getattr(args, f.name) == getattr(defaults, f.name), f.name


def test_parsed_flags_build_the_same_config_as_keywords():
    argv = ["--model", "m", "--attention", "gqa", "--kv-head-groups", "2", "--kv-cache-dtype", "int8",
            "--no-chunked-prefill", "--max-model-len", "512", "--validation-sample-rate", "0.5", "--cuda-graphs"]
    got = EngineConfig(model="m", **config_kwargs(_parser().parse_args(argv)))
    want = EngineConfig(model="m", attention="gqa", kv_head_groups=2, kv_cache_dtype="int8",
                        enable_chunked_prefill=False, max_model_len=512, validation_sample_rate=0.5, cuda_graphs=True)
    assert got == want


def test_a_new_knob_needs_only_its_field():
    @dataclasses.dataclass
    class Config:
        window: int | None = knob(None, "tokens kept")
        ratio: float = knob(0.5, "a share")
        mode: str = knob("a", "which mode", choices=("a", "b"))
        fast: bool = knob(True, "go fast", flag="--turbo")
        hidden: int = 3

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Config)
    args = parser.parse_args(["--window", "7", "--ratio", "0.25", "--mode", "b", "--no-turbo"])
    assert config_kwargs(args, Config) == {"window": 7, "ratio": 0.25, "mode": "b", "fast": False}
    assert not hasattr(args, "hidden")
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])


def test_a_knob_of_a_type_argparse_cannot_parse_is_refused():
    @dataclasses.dataclass
    class Config:
        table: dict = knob(None, "a mapping")  # noqa: RUF009 - the field under test

    with pytest.raises(TypeError, match=r"Config\.table: a flag needs an int, float, str or bool field"):
        add_config_arguments(argparse.ArgumentParser(), Config)
