"""GPU tier: the engine's int8 / fp8 / auto-switched KV caches through the compiled Triton kernels.

Run on the device machine: `pytest -m gpu tests/gpu/test_kv_quant_engine_gpu.py -q -s`.
- fp32: the CUDA engine (Triton store, decode with in-kernel dequantisation, block-dequant prefill)
  against the CPU engine (torch references) on the same teacher-forced tokens.
- bf16: each 8-bit cache against the bf16-cache engine, the bounds of the CPU tests loosened for
  bf16 rounding (printed, so docs/strategies.md can record the measured values).
"""

from __future__ import annotations

import random

import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from tests.helpers.forced_logits import compare_logits, teacher_forced_logits
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
BF16_BOUNDS = {"int8": (0.995, 0.9), "fp8": (0.99, 0.8), "auto": (0.995, 0.9)}  # (cosine mean, top-1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = build_hf_checkpoint(tmp_path_factory.mktemp("llama-gqa"), "llama", seed=11, num_key_value_heads=2)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 384) for _ in range(rng.randrange(8, 120))] for _ in range(12)]
    return path, prompts


def engine(path, device: str, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), device=device, show_progress=False, num_kv_blocks=256, **kw))


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_cuda_quantised_engine_matches_cpu_reference_fp32(checkpoint, kv):
    path, prompts = checkpoint
    conts = engine_greedy(engine(path, "cuda", dtype="float32"), prompts, 32)
    cpu = teacher_forced_logits(engine(path, "cpu", dtype="float32", kv_cache_dtype=kv), prompts, conts)
    gpu = teacher_forced_logits(engine(path, "cuda", dtype="float32", kv_cache_dtype=kv), prompts, conts)
    got = compare_logits(cpu, gpu)
    worst = max(float((a - b).abs().max()) for a, b in zip(cpu, gpu, strict=True))
    print(f"cuda vs cpu {kv} fp32: {got}, max |diff| {worst:.2e}")
    # fp8 on the H200 measured max |diff| 1.4e-2 (cosine_min 0.99999, top-1 1.0): an fp8 code that
    # sits on a rounding boundary moves a whole quantisation step when the fp32 inputs differ in the
    # last bits (TF32 projections on CUDA), so fp8 gets a step-sized bound; int8 measured < 5e-3.
    bound = 3e-2 if kv == "fp8" else 5e-3
    assert got["cosine_min"] > 0.9999 and got["top1"] >= 0.99 and worst < bound, (got, worst)


@pytest.mark.parametrize("kv", ["int8", "fp8", "auto"])
def test_cuda_bf16_quantised_cache_tracks_bf16_cache(checkpoint, kv):
    path, prompts = checkpoint
    conts = engine_greedy(engine(path, "cuda", dtype="bfloat16"), prompts, 32)
    exact = teacher_forced_logits(engine(path, "cuda", dtype="bfloat16"), prompts, conts)
    kw = {"kv_quant_auto_threshold": 4, "max_num_batched_tokens": 4096} if kv == "auto" else {"kv_cache_dtype": kv}
    eng = engine(path, "cuda", dtype="bfloat16", **kw)
    got = compare_logits(exact, teacher_forced_logits(eng, prompts, conts))
    print(f"cuda bf16 {kv}: {got}")
    mean, top1 = BF16_BOUNDS[kv]
    assert got["cosine_mean"] >= mean and got["top1"] >= top1, got
    if kv == "auto":
        assert eng.block_manager.switches_total >= 1
    assert eng.block_manager.num_used_blocks == 0
