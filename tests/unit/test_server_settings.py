"""`kvpilot serve`'s own flags come from ServerSettings' fields and parse back into one ServerSettings."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from kvpilot.engine.config.arguments import cli_fields
from kvpilot.engine.server.cli import add_arguments
from kvpilot.engine.server.runtime.settings import ServerSettings, setting_fields, settings_from_args

pytestmark = pytest.mark.unit


def _parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvpilot serve")
    add_arguments(parser)
    return parser.parse_args(list(flags))


def test_no_flag_of_the_server_shares_a_destination_with_an_engine_knob():
    assert {f.name for f in setting_fields()} & {f.name for f in cli_fields()} == set()


def test_the_defaults_parse_into_the_dataclass_defaults(tmp_path):
    settings = settings_from_args(_parse("--model", str(tmp_path)))
    assert settings == ServerSettings(model=tmp_path)
    assert (settings.host, settings.port, settings.score_route, settings.warmup) == ("127.0.0.1", 8000, True, True)
    assert settings.faults.active is False and settings.api_key is None and settings.chat_template_text is None


def test_flags_that_turn_something_off_and_renamed_flags_land_in_their_fields(tmp_path):
    settings = settings_from_args(_parse(
        "--model", str(tmp_path), "--no-score-route", "--no-warmup", "--served-model-name", "m",
        "--strategy-name", "s", "--idempotency-ttl", "7", "--body-timeout", "3", "--fault-latency-ms", "2",
    ))  # fmt: skip
    assert (settings.score_route, settings.warmup, settings.model_name, settings.strategy) == (False, False, "m", "s")
    assert (settings.idempotency_ttl_seconds, settings.body_timeout_seconds) == (7.0, 3.0)
    assert settings.faults.latency_ms == 2.0 and settings.faults.active


def test_the_api_key_is_read_from_its_file_and_the_two_key_flags_exclude_each_other(tmp_path, capsys):
    key = tmp_path / "key"
    key.write_text("  secret\n")
    assert settings_from_args(_parse("--model", str(tmp_path), "--api-key-file", str(key))).api_key == "secret"
    assert "secret" not in repr(ServerSettings(api_key="secret"))
    with pytest.raises(SystemExit):
        _parse("--model", str(tmp_path), "--api-key", "a", "--api-key-file", str(key))
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse("--port", "1")  # neither --model nor --shape
    assert "one of the arguments --model --shape is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--max-body-bytes", "0"), "--max-body-bytes"),
        (("--body-timeout", "0"), "--body-timeout"),
        (("--max-connections", "0"), "--max-connections"),
        (("--max-grammar-bytes", "10", "--grammar-cache-bytes", "5"), "--grammar-cache-bytes"),
        (("--fault-error-rate", "2"), "--fault-error-rate"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_its_flag(tmp_path, flags, named):
    with pytest.raises(ValueError, match=named):
        settings_from_args(_parse("--model", str(tmp_path), *flags))


def test_a_resolved_copy_keeps_the_flags_and_rechecks_them(tmp_path):
    settings = settings_from_args(_parse("--model", str(tmp_path), "--fault-seed", "3"))
    resolved = dataclasses.replace(settings, model_name="m", strategy="s")
    assert resolved.faults.seed == 3 and resolved.model == tmp_path
    with pytest.raises(ValueError, match="--max-concurrent-scores"):
        dataclasses.replace(settings, max_concurrent_scores=0)
