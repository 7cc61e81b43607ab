"""`kvpilot serve --attention mla --latent-rank r [--disable-mla]` reaches the EngineConfig and the plan."""

from __future__ import annotations

import argparse
import json

import pytest

from kvpilot.engine.make_model import model_config
from kvpilot.engine.server.cli import _prepare, add_arguments

pytestmark = pytest.mark.unit


def _prepare_for(tmp_path, *extra: str):
    (tmp_path / "config.json").write_text(json.dumps(model_config("llama")))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return _prepare(parser.parse_args(["--model", str(tmp_path), "--device", "cpu", *extra]))


@pytest.mark.parametrize(
    ("extra", "strategy", "disabled"),
    [([], "mla16-fp32", False), (["--disable-mla"], "native-fp32", True)],
)
def test_serve_flags_select_the_mla_conversion(tmp_path, extra, strategy, disabled) -> None:
    config, settings, plan_text = _prepare_for(tmp_path, "--attention", "mla", "--latent-rank", "16", *extra)
    assert (config.attention, config.latent_rank, config.disable_mla) == ("mla", 16, disabled)
    assert settings.strategy == strategy
    assert "KV pool:" in plan_text


def test_plan_counts_latent_bytes(tmp_path) -> None:
    """Tiny llama: K/V are 2 x 2 heads x 16 = 64 values per token and layer; rank 16 caches 16."""
    native, _, _ = _prepare_for(tmp_path)
    mla, _, _ = _prepare_for(tmp_path, "--attention", "mla", "--latent-rank", "16")
    assert mla.num_kv_blocks >= 3 * native.num_kv_blocks


def test_bad_latent_rank_is_refused() -> None:
    from kvpilot.engine.config import EngineConfig

    with pytest.raises(ValueError, match="latent_rank must be >= 1"):
        EngineConfig(model="m", attention="mla", latent_rank=0)
