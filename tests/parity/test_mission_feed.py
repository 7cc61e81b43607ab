"""The engine's stats feed carries the mission metrics: sampled gqa_head_utilization, kv efficiency."""

from __future__ import annotations

import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.models import build_hf_checkpoint

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("feed") / "llama", "llama")


def run_some(eng: LLMEngine, steps: int) -> None:
    eng.add_request("a", list(range(3, 40)), SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    eng.add_request("b", list(range(5, 25)), SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    for _ in range(steps):
        eng.step()


def test_head_utilization_is_sampled_per_layer_and_kv_head(ckpt):
    eng = LLMEngine(EngineConfig(model=str(ckpt), device="cpu", show_progress=False, head_utilization_every=2))
    mc = eng.model_config
    run_some(eng, 2)  # prefill, then decode step 1
    assert eng.stats()["gqa_head_utilization"] == []
    eng.step()  # decode step 2: layer 0 sampled (one layer per sample, round robin)
    assert [(e["layer"], e["kv_head"]) for e in eng.stats()["gqa_head_utilization"]] == [
        (0, h) for h in range(mc.num_key_value_heads)
    ]
    eng.step()
    eng.step()  # decode step 4: layer 1
    feed = eng.stats()["gqa_head_utilization"]
    assert [(e["layer"], e["kv_head"]) for e in feed] == [
        (layer, h) for layer in range(mc.num_hidden_layers) for h in range(mc.num_key_value_heads)
    ]
    assert all(0.0 < e["value"] <= 1.0 for e in feed)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "auto"])
def test_head_utilization_skips_8bit_caches(ckpt, kv_cache_dtype):
    threshold = 1 if kv_cache_dtype == "auto" else None  # auto: the second sequence gets int8 blocks
    eng = LLMEngine(EngineConfig(model=str(ckpt), device="cpu", show_progress=False, head_utilization_every=1,
                                 kv_cache_dtype=kv_cache_dtype, kv_quant_auto_threshold=threshold))  # fmt: skip
    run_some(eng, 4)  # with int8 blocks the keys are not floats in k_cache: no sample, and no crash
    assert eng.stats()["gqa_head_utilization"] == []


def test_head_utilization_off(ckpt):
    eng = LLMEngine(EngineConfig(model=str(ckpt), device="cpu", show_progress=False, head_utilization_every=0))
    run_some(eng, 6)
    assert eng.stats()["gqa_head_utilization"] == []


def test_kv_efficiency_in_the_feed(ckpt):
    eng = LLMEngine(EngineConfig(model=str(ckpt), device="cpu", show_progress=False, block_size=16))
    run_some(eng, 4)  # a: 37 + 3 generated tokens computed -> 3 blocks; b: 20 + 3 -> 2 blocks
    kv = eng.stats()["kv"]
    live = sum(s.num_computed_tokens for s in eng.scheduler.running)
    assert kv["live_token_slots"] == live
    assert kv["allocated_token_slots"] == 16 * sum(len(s.block_table) for s in eng.scheduler.running)
    assert kv["efficiency"] == pytest.approx(live / kv["allocated_token_slots"])
