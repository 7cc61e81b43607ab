"""GPU tier: decode steps replayed from CUDA graphs (EngineConfig.cuda_graphs) against the eager engine.

Run on the device machine: `pytest -m gpu tests/gpu/test_cuda_graphs_gpu.py -q -s`.
max_num_seqs 24 gives buckets 1, 2, 4, 8, 16, 24; 20 requests finishing one by one run decode
batches 20 (padded to 24), 16 (hit), 9-15 (padded to 16), 8 (hit), ... 1, so padded and exact
buckets both replay. max_model_len 512 keeps the static block table (32 columns) at the eager
path's context-split choice, so the same kernels run on the same rows.
"""

from __future__ import annotations

import random

import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.worker.cuda_graphs import graph_batch_sizes
from tests.helpers.forced_logits import compare_logits, teacher_forced_logits
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
MAX_SEQS = 24
# 8-bit caches with and without the 16-bit fallback reserve (the default, 0.1): both capture; with a reserve the
# graphs run the 8-bit pool's rebased block ids (layers/pool_split.split_step), reserve steps run eagerly
KV = {"bf16": {}, "int8": {"kv_cache_dtype": "int8", "fallback_reserve": 0.0},
      "fp8": {"kv_cache_dtype": "fp8", "fallback_reserve": 0.0},
      "int8-reserve": {"kv_cache_dtype": "int8"}, "fp8-reserve": {"kv_cache_dtype": "fp8"}}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = build_hf_checkpoint(tmp_path_factory.mktemp("llama-graphs"), "llama", seed=5, num_key_value_heads=2)
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 384) for _ in range(rng.randrange(4, 100))] for _ in range(20)]
    lengths = [8 + 2 * i for i in range(20)]  # one request finishes every other step: every batch size
    return path, prompts, lengths


def engine(path, dtype: str, graphs: bool, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=str(path), device="cuda", dtype=dtype, show_progress=False, num_kv_blocks=512, max_model_len=512,
        max_num_seqs=MAX_SEQS, cuda_graphs=graphs, **kw,
    ))


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    same = sum(x == y for s, t in zip(a, b, strict=True) for x, y in zip(s, t, strict=True))
    return same / sum(len(s) for s in a)


def test_fp32_graphs_match_eager_token_for_token(checkpoint):
    path, prompts, lengths = checkpoint
    want = engine_greedy(engine(path, "float32", False), prompts, lengths)
    eng = engine(path, "float32", True)
    graphs = eng.runner.decode_graphs
    assert graphs is not None and sorted(graphs.graphs) == graph_batch_sizes(MAX_SEQS)
    got = engine_greedy(eng, prompts, lengths)
    print(f"fp32: {graphs.replays_total} replays of {graphs.steps_total} graph steps")
    assert got == want
    assert graphs.replays_total == graphs.steps_total >= max(lengths) - 2
    assert eng.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("kv", list(KV))
def test_bf16_graphs_track_eager(checkpoint, kv):
    path, prompts, lengths = checkpoint
    eager = engine(path, "bfloat16", False, **KV[kv])
    want = engine_greedy(eager, prompts, lengths)
    eng = engine(path, "bfloat16", True, **KV[kv])
    graphs = eng.runner.decode_graphs
    assert graphs is not None and sorted(graphs.graphs) == graph_batch_sizes(MAX_SEQS)
    assert len(eng.runner.kv_pool_sizes) == (2 if kv.endswith("-reserve") else 1)
    got = engine_greedy(eng, prompts, lengths)
    tokens = agreement(want, got)
    exact = teacher_forced_logits(eager, prompts, want)
    replayed = teacher_forced_logits(eng, prompts, want)
    logits = compare_logits(exact, replayed)
    print(f"bf16 {kv}: greedy agreement {tokens:.4f} ({sum(g == w for g, w in zip(got, want, strict=True))}/"
          f"{len(want)} sequences identical), teacher-forced {logits}, {graphs.replays_total} replays")
    # the same kernels on the same rows; a padded batch may only change the GEMM tiling (bf16 rounding)
    assert logits["cosine_min"] > 0.999 and logits["top1"] >= 0.99, logits
    assert tokens >= 0.9
    assert graphs.replays_total >= max(lengths) - 2
    assert eng.block_manager.num_used_blocks == 0 and eager.block_manager.num_used_blocks == 0
    if kv.startswith("fp8"):  # calibrated by the first eager prefill, not by capture's padding: the eager engine's scales
        layers = [[m.kv_quant for m in e.runner.model.attention_layers()] for e in (eager, eng)]
        for a, b in zip(*layers, strict=True):
            assert a.calibrated and b.calibrated
            torch.testing.assert_close(a.k_scale, b.k_scale)
            torch.testing.assert_close(a.v_scale, b.v_scale)


@pytest.mark.parametrize("kw", [{"kv_quant_auto_threshold": 4}, {"eviction": "sinks"}])
def test_graph_unsafe_strategies_stay_eager(checkpoint, kw):
    path, prompts, lengths = checkpoint
    extra = {"eviction_window": 64, "max_num_batched_tokens": 4096} if "eviction" in kw else {}
    eng = engine(path, "bfloat16", True, **kw, **extra)
    assert eng.runner.decode_graphs is None
    assert all(len(t) == n for t, n in zip(engine_greedy(eng, prompts[:4], lengths[:4]), lengths[:4], strict=True))
    assert eng.block_manager.num_used_blocks == 0


def test_sampled_steps_replay_and_hooks_fire(checkpoint):
    """head-utilisation sampling on every 3rd decode step reads the query rows the rotary kernel taps
    (cuda_graphs.QueryTap), its hook called after the replay: those steps replay too, with the eager engine's
    tokens and sampled values (they had run eagerly, the hook reading the layer's q)."""
    path, prompts, lengths = checkpoint
    eager = engine(path, "float32", False, head_utilization_every=3)
    want = engine_greedy(eager, prompts[:6], lengths[:6])
    eng = engine(path, "float32", True, head_utilization_every=3)
    got = engine_greedy(eng, prompts[:6], lengths[:6])
    graphs = eng.runner.decode_graphs
    sampler, reference = eng.checks.head_utilization, eager.checks.head_utilization
    assert got == want
    assert graphs.query_tap is not None
    assert sampler.samples_total == reference.samples_total >= 3
    # every decode step replayed, the sampled ones (every 3rd) too
    assert graphs.replays_total == graphs.steps_total >= max(lengths[:6]) - 2
    assert sampler.values.keys() == reference.values.keys()
    for layer, values in reference.values.items():
        assert sampler.values[layer] == pytest.approx(values, rel=1e-4)
    assert eng.stats()["gqa_head_utilization"]
