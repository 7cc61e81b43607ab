"""`kvpilot serve` sizes its KV pool from the capacity plan (server/runtime/capacity_plan.py): the plan's block
bytes and weights must be what the engine then allocates, or the pool overshoots its memory (a bf16 checkpoint
computed in float32, as on CPU, holds twice its files' bytes) or leaves memory unused (fp8's per-layer scales)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvpilot.engine.server.runtime.capacity_plan import loaded_weight_bytes, plan_for
from tests.helpers.deepseek import build_deepseek_checkpoint
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import make_engine

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory) -> Path:
    """A Llama checkpoint stored in bf16 (float32 compute on CPU doubles it)."""
    path = build_hf_checkpoint(tmp_path_factory.mktemp("llama"), "llama", seed=1, num_key_value_heads=4)
    for file in path.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(file).items()}, file, metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config.pop("dtype", None)
    (path / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    return path


def _allocated(engine) -> tuple[int, int]:
    """Bytes per KV block and of the model's tensors: parameters and buffers (a conversion keeps its factors and
    the original K/V projections as buffers)."""
    model = engine.runner.model
    tensors = [*model.parameters(), *model.buffers()]
    return engine.runner.bytes_per_block, sum(t.numel() * t.element_size() for t in tensors)


ROTARY_SLACK = 1024  # the rotary inv_freq buffers: in no checkpoint, a few hundred bytes


@pytest.mark.parametrize(
    "knobs",
    [{}, {"dtype": "bfloat16"}, {"dtype": "float16"}, {"kv_cache_dtype": "bfloat16"}, {"kv_cache_dtype": "int8"},
     {"kv_cache_dtype": "fp8"}, {"dtype": "bfloat16", "kv_cache_dtype": "fp8"}, {"attention": "gqa", "kv_head_groups": 2},
     {"attention": "mla", "latent_rank": 32}],
    ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "defaults",
)  # fmt: skip
def test_the_plan_counts_what_the_engine_allocates(bf16_llama: Path, knobs: dict) -> None:
    engine = make_engine(bf16_llama, **knobs)
    plan = plan_for(engine.config, "cpu", 2**30, 0.9)
    blocks, weights = _allocated(engine)
    assert plan.block_bytes == blocks
    assert 0 <= weights - plan.weights_bytes < ROTARY_SLACK  # a GQA/MLA conversion's extra tensors included


def test_a_native_mla_checkpoint_plans_its_latent_rows(tmp_path: Path) -> None:
    engine = make_engine(build_deepseek_checkpoint(tmp_path, version=2, seed=0))
    plan = plan_for(engine.config, "cpu", 2**30, 0.9)
    blocks, weights = _allocated(engine)
    assert plan.block_bytes == blocks and 0 <= weights - plan.weights_bytes < ROTARY_SLACK


def test_weights_load_in_the_compute_dtype(bf16_llama: Path) -> None:
    files = sum(f.stat().st_size for f in bf16_llama.glob("*.safetensors"))
    assert loaded_weight_bytes(bf16_llama, 2) < files < loaded_weight_bytes(bf16_llama, 4)  # the header's bytes
    assert loaded_weight_bytes(bf16_llama.parent, 4) is None  # no safetensors: the planner's estimate


def test_a_file_that_is_not_safetensors_is_named(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match=r"model\.safetensors is not a safetensors file"):
        loaded_weight_bytes(tmp_path, 2)
    (tmp_path / "model.safetensors").write_bytes((8).to_bytes(8, "little") + b"\xff\xfe{}}}}}}")
    with pytest.raises(ValueError, match="header is not JSON"):
        loaded_weight_bytes(tmp_path, 2)


def _pool_bytes(engine) -> int:
    cache = engine.runner.cache
    state = engine.runner.linear_state.bytes_total if engine.runner.linear_state is not None else 0
    return cache.kv_cache.numel() * cache.kv_cache.element_size() + cache.quant_bytes + state


_SIZING = {"max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": 256}


@pytest.mark.parametrize(
    "knobs",
    [{}, {"kv_cache_dtype": "int8"}, {"kv_cache_dtype": "fp8"}, {"attention": "gqa", "kv_head_groups": 2},
     {"attention": "mla", "latent_rank": 32}, {"kv_cache_dtype": "auto", "kv_quant_auto_threshold": 4},
     {"attention": "linear"}, {"eviction": "sinks", "eviction_window": 64},
     {"kv_cache_dtype": "int8", "eviction": "ladder", "eviction_window": 64},
     {"attention": "linear", "eviction": "sinks", "eviction_sinks": 0, "eviction_window": 64}],
    ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "defaults",
)  # fmt: skip
def test_the_engine_fills_the_planned_pool(bf16_llama: Path, knobs: dict) -> None:
    """`kvpilot serve` sets num_kv_blocks = plan.engine_blocks: the pool the engine allocates, the fallback
    reserve and the recurrent state included, is the plan's pool (before, the reserve was left out of it and a
    converted or 8-bit pool used ~90% of its memory)."""
    probe = make_engine(bf16_llama, num_kv_blocks=64, **_SIZING, **knobs)
    plan = plan_for(probe.config, "cpu", 64 * 2**20, 0.9)
    engine = make_engine(bf16_llama, num_kv_blocks=plan.engine_blocks, **_SIZING, **knobs)
    assert 0.99 * plan.kv_pool_bytes < _pool_bytes(engine) <= plan.kv_pool_bytes


def test_a_hybrid_model_fills_the_planned_pool(tmp_path: Path) -> None:
    """MiniMax: lightning-attention layers hold a recurrent state per sequence slot beside the paged layers."""
    from tests.helpers.minimax import build_minimax_checkpoint

    path = build_minimax_checkpoint(tmp_path)
    probe = make_engine(path, num_kv_blocks=4, **_SIZING)
    plan = plan_for(probe.config, "cpu", 64 * 2**20, 0.9)
    engine = make_engine(path, num_kv_blocks=plan.engine_blocks, **_SIZING)
    assert engine.runner.linear_state is not None
    assert 0.99 * plan.kv_pool_bytes < _pool_bytes(engine) <= plan.kv_pool_bytes
