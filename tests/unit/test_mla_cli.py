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


def test_plan_counts_the_partial_rope_rows(tmp_path) -> None:
    """--mla-rope-dims 4 caches 2 KV heads x 4 exact rope dims beside the rank-8 latent: the plan sizes
    blocks of 16 values per token and layer, as --latent-rank 16 does."""
    rope, _, _ = _prepare_for(tmp_path, "--attention", "mla", "--latent-rank", "8", "--mla-rope-dims", "4")
    plain, _, _ = _prepare_for(tmp_path, "--attention", "mla", "--latent-rank", "16")
    assert rope.mla_rope_dims == 4 and rope.mla_rope_pairs == "auto"
    assert rope.num_kv_blocks == plain.num_kv_blocks
    _, settings, _ = _prepare_for(tmp_path, "--attention", "mla", "--latent-rank", "8", "--mla-rope-dims", "4")
    assert settings.strategy == "mla8rope4-fp32"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mla_rope_dims": 3}, "mla_rope_dims=3 must be an even number >= 0"),
        ({"mla_rope_dims": -2}, "mla_rope_dims=-2 must be an even number >= 0"),
        ({"mla_rope_dims": 4, "attention": "gqa", "kv_head_groups": 1}, "applies to attention='mla' only"),
        ({"mla_rope_dims": 4, "mla_rope_pairs": "norm"}, "set conversion_calibration"),
        ({"mla_rope_dims": 4, "mla_rope_pairs": "turn"}, "set conversion_calibration"),
        ({"mla_rope_pairs": "low"}, "choose one of auto, high, norm, turn"),
    ],
)
def test_bad_mla_rope_settings_are_refused(fields, message) -> None:
    from kvpilot.engine.config import EngineConfig

    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **{"attention": "mla", "latent_rank": 8, **fields})


def test_rope_dims_beyond_head_dim_are_refused_before_weights_load(tmp_path, monkeypatch) -> None:
    from kvpilot.engine.llm_engine import LLMEngine
    from kvpilot.engine.worker import model_runner
    from tests.helpers.models import build_hf_checkpoint

    path = build_hf_checkpoint(tmp_path / "llama", "llama")  # head_dim 16

    def no_load(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr(model_runner, "load_weights", no_load)
    from kvpilot.engine.config import EngineConfig

    with pytest.raises(ValueError, match="mla_rope_dims=18 exceeds head_dim=16"):
        LLMEngine(EngineConfig(model=str(path), device="cpu", attention="mla", latent_rank=8, mla_rope_dims=18))
