"""Tensor parallelism's pure parts: which heads and rows each rank holds, and what is refused (and where)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch import nn

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.config.strategy import check_model_strategy
from kvpilot.engine.layers.parallel import column_linear, embedding, lm_head, row_linear
from kvpilot.engine.make_model import model_config
from kvpilot.engine.parallel.shard import HeadShard, head_shard, vocab_split
from kvpilot.planner import KVStrategy, ModelShape, PlannerError, gpu_spec, plan_capacity
from tests.helpers.model_configs import LLAMA3_8B

pytestmark = pytest.mark.unit


def test_heads_split_and_kv_heads_copied_when_fewer_than_ranks() -> None:
    assert [head_shard(4, 2, r, 2) for r in range(2)] == [HeadShard(2, 0, 1, 0), HeadShard(2, 2, 1, 1)]
    assert [head_shard(32, 8, r, 4).kv_start for r in range(4)] == [0, 2, 4, 6]
    # 2 KV heads over 4 ranks: one each, ranks 0-1 hold head 0, ranks 2-3 head 1 (vLLM's layout)
    assert [head_shard(4, 2, r, 4) for r in range(4)] == [
        HeadShard(1, 0, 1, 0), HeadShard(1, 1, 1, 0), HeadShard(1, 2, 1, 1), HeadShard(1, 3, 1, 1)]  # fmt: skip
    with pytest.raises(ValueError, match=r"must divide num_attention_heads=4; choose one of \[1, 2, 4\]"):
        head_shard(4, 4, 0, 3)
    with pytest.raises(ValueError, match="one must divide the other"):
        head_shard(12, 3, 0, 2)


def test_vocab_rows_are_an_even_padded_share() -> None:
    assert [vocab_split(385, r, 4) for r in range(4)] == [(0, 97, 97), (97, 97, 97), (194, 97, 97), (291, 94, 97)]
    assert vocab_split(384, 3, 4) == (288, 96, 96)


def test_one_rank_builds_plain_torch_layers() -> None:
    assert type(column_linear(8, 16, True)) is nn.Linear and type(row_linear(16, 8, False)) is nn.Linear
    assert type(embedding(10, 4)) is nn.Embedding and type(lm_head(4, 10)) is nn.Linear


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be >= 1"),
        ({"tensor_parallel_size": 2, "attention": "linear"}, "attention='linear' is not available"),
        ({"tensor_parallel_size": 2, "attention": "mla", "latent_rank": 8}, "or tensor_parallel_size=1"),
        ({"tensor_parallel_timeout": 0}, "tensor_parallel_timeout must be > 0"),
        ({"tensor_parallel_size": 2, "attention": "gqa", "kv_head_groups": 1, "conversion_calibration": "t.txt"},
         "drop conversion_calibration"),
    ],
)
def test_config_refusals_say_what_is_allowed(knobs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **knobs)
    EngineConfig(model="m", tensor_parallel_size=2, attention="mla", latent_rank=8, disable_mla=True)


def _model(tmp_path: Path, family: str, **overrides) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(model_config(family, "tiny", **overrides)))
    return ModelConfig.from_dir(tmp_path)


def test_model_refusals_come_from_the_strategy_check(tmp_path: Path) -> None:
    tp2 = EngineConfig(model=str(tmp_path), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="serves llama, mistral, qwen2 checkpoints, not 'deepseek_v2'"):
        check_model_strategy(tp2, _model(tmp_path, "deepseek_v2"))
    with pytest.raises(ValueError, match="must divide intermediate_size=129"):
        check_model_strategy(tp2, _model(tmp_path, "llama", intermediate_size=129))
    gqa3 = EngineConfig(model=str(tmp_path), tensor_parallel_size=2, attention="gqa", kv_head_groups=3)
    with pytest.raises(ValueError, match="served num_key_value_heads=3"):
        check_model_strategy(gqa3, _model(tmp_path, "llama", num_attention_heads=6, num_key_value_heads=6))
    check_model_strategy(tp2, _model(tmp_path, "qwen2", num_key_value_heads=1))  # one KV head: copied


def test_planner_refuses_gpus_that_do_not_split_the_heads() -> None:
    with pytest.raises(PlannerError, match=r"3 GPUs .* must divide num_attention_heads=32"):
        plan_capacity(ModelShape.from_hf_config(LLAMA3_8B), KVStrategy(), gpu_spec("h100"), max_seq_len=4096, gpus=3)
