"""The planner's rows and weights for partial-RoPE MLA and calibrated GQA, and the operator's plan agreeing
with the one `kvpilot serve` sizes its pool from (engine/server/runtime/capacity_plan.py) for the same strategy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpilot.engine.config.engine import EngineConfig
from kvpilot.engine.server.runtime.capacity_plan import plan_for
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec
from kvpilot.planner import GpuSpec, KVStrategy, ModelShape, PlannerError, plan_capacity
from kvpilot.planner.pools import extra_weight_bytes
from kvpilot.planner.strategy import kv_footprint
from tests.helpers.model_configs import LLAMA3_8B

pytestmark = pytest.mark.unit
MODEL = ModelShape.from_hf_config(LLAMA3_8B)


def test_partial_rope_caches_exact_keys_per_kv_head_beside_the_latent() -> None:
    rope = KVStrategy(attention="mla", latent_rank=256, mla_rope_dims=32)
    plain = KVStrategy(attention="mla", latent_rank=256)
    per_layer = (256 + MODEL.num_kv_heads * 32) * MODEL.dtype_bytes
    assert kv_footprint(MODEL, rope).bytes_per_token == MODEL.num_layers * per_layer
    assert kv_footprint(MODEL, plain).bytes_per_token == MODEL.num_layers * 256 * MODEL.dtype_bytes
    h, kv = MODEL.hidden_size, MODEL.num_kv_heads * MODEL.head_dim
    width = 256 + MODEL.num_kv_heads * 32  # counted at the row's width, as the engine plans it
    assert extra_weight_bytes(MODEL, rope) == MODEL.num_layers * (width * h + 2 * kv * width) * MODEL.dtype_bytes
    assert (rope.label, plain.label) == ("mla256rope32", "mla256")


@pytest.mark.parametrize("kwargs, match", [
    (dict(attention="gqa", kv_head_groups=4, mla_rope_dims=16), "attention 'mla' only"),
    (dict(attention="mla", latent_rank=64, mla_rope_dims=15), "even number"),
])
def test_rope_dims_are_even_and_for_mla_only(kwargs: dict, match: str) -> None:
    with pytest.raises(PlannerError, match=match):
        KVStrategy(**kwargs)


def test_rope_dims_above_head_dim_are_refused_with_the_bound() -> None:
    with pytest.raises(PlannerError, match=r"head_dim 128; choose an even number in 2..128"):
        kv_footprint(MODEL, KVStrategy(attention="mla", latent_rank=64, mla_rope_dims=130))


def engine_plan(tmp_path: Path, **config):  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    (tmp_path / "calibration.txt").write_text("text")
    # dtype: the operator's pods run on CUDA, where the engine's auto is the checkpoint's (bf16), not CPU's float32
    engine = EngineConfig(model=str(tmp_path), max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=8192,
                          fallback_reserve=0.1, dtype="bfloat16", **config)
    return plan_for(engine, "cpu", 200 * 2**30, 0.9)


def operator_plan(**strategy):  # type: ignore[no-untyped-def]
    spec = ServiceSpec.from_dict({"model": {"uri": "/m"}, "strategy": {"maxSeqLen": 8192, **strategy}})
    preflight(spec, LLAMA3_8B)  # the operator's own checks pass
    return plan_capacity(MODEL, spec.strategy.planner_strategy(), GpuSpec("cpu-budget", 200 * 2**30, cuda_context_bytes=0),
                         max_seq_len=8192, max_num_batched_tokens=8192, max_num_seqs=64, watermark=0.9)


@pytest.mark.parametrize("engine, operator", [
    (dict(attention="mla", latent_rank=512, mla_rope_dims=16, mla_rope_pairs="turn"),
     dict(attention="mla", latentRank=512, mlaRopeDims=16, mlaRopePairs="turn")),
    (dict(attention="gqa", kv_head_groups=4), dict(attention="gqa", kvHeadGroups=4)),
    (dict(attention="mla", latent_rank=512), dict(attention="mla", latentRank=512)),
])
def test_the_operator_plans_what_the_engine_plans(tmp_path: Path, engine: dict, operator: dict) -> None:
    calibration = str(tmp_path / "calibration.txt")
    theirs = engine_plan(tmp_path, conversion_calibration=calibration, **engine)
    ours = operator_plan(calibration={"configMap": "text"}, **operator)
    assert (ours.bytes_per_token, ours.weights_bytes, ours.kv_pool_bytes, ours.reserve_bytes, ours.max_concurrency) \
        == (theirs.bytes_per_token, theirs.weights_bytes, theirs.kv_pool_bytes, theirs.reserve_bytes,
            theirs.max_concurrency)
    uncalibrated = operator_plan(**{k: v for k, v in operator.items() if k != "mlaRopePairs"})  # turn needs text
    if operator["attention"] == "gqa":  # the calibrated conversion keeps every layer's original o_proj
        o_proj = MODEL.num_layers * MODEL.hidden_size * MODEL.num_attention_heads * MODEL.head_dim * 2
        assert ours.weights_bytes - uncalibrated.weights_bytes == o_proj
    else:
        assert ours.weights_bytes == uncalibrated.weights_bytes
