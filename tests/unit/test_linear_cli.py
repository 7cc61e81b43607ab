"""`kvpilot serve --attention linear --linear-window W [--disable-linear]` reaches the EngineConfig."""

from __future__ import annotations

import argparse
import json

import pytest

from kvpilot.engine.make_model import model_config
from kvpilot.engine.server.cli import _prepare, add_arguments

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("extra", "strategy", "linear"),
    [([], "linear16-fp32", True), (["--disable-linear"], "native-fp32", False)],
)
def test_serve_flags_select_the_performer_conversion(tmp_path, extra, strategy, linear) -> None:
    (tmp_path / "config.json").write_text(json.dumps(model_config("llama")))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--model", str(tmp_path), "--device", "cpu", "--attention", "linear", "--linear-window", "16",
         "--linear-features", "32", *extra]
    )  # fmt: skip
    config, settings, _ = _prepare(args)
    assert (config.attention, config.linear_window, config.linear_features) == ("linear", 16, 32)
    assert config.disable_linear is not linear
    assert settings.strategy == strategy


def test_bad_window_is_refused_with_the_allowed_range() -> None:
    from kvpilot.engine.config import EngineConfig

    with pytest.raises(ValueError, match="linear_window"):
        EngineConfig(model="m", attention="linear", linear_window=0)
