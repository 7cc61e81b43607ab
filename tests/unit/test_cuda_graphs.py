"""CUDA-graph decode (kvpilot/engine/worker/cuda_graphs.py) without CUDA: buckets, padding, fallback decisions,
and the padded static-buffer forward on a CPU engine (the graphs' inputs, run eagerly) against the
plain engine, token for token."""

from __future__ import annotations

import argparse
import random

import pytest
import torch
from torch import nn

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.context import Context
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.server.cli import add_arguments
from kvpilot.engine.worker.cuda_graphs import (
    DecodeGraphs,
    StaticInputs,
    engine_fallback_reason,
    graph_batch_sizes,
    has_forward_hooks,
    pick_bucket,
    runner_fallback_reason,
    step_fallback_reason,
    table_width,
    uncaptured_decode_graphs,
)
from tests.parity.helpers import engine_greedy

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("max_num_seqs", "want"),
    [(1, [1]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (16, [1, 2, 4, 8, 16]), (20, [1, 2, 4, 8, 16, 20]),
     (64, [1, 2, 4, 8, 16, 32, 48, 64]), (70, [1, 2, 4, 8, 16, 32, 48, 64, 70])],
)
def test_graph_batch_sizes(max_num_seqs: int, want: list[int]) -> None:
    assert graph_batch_sizes(max_num_seqs) == want


def test_graph_batch_sizes_rejects_zero() -> None:
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        graph_batch_sizes(0)


@pytest.mark.parametrize("max_num_seqs", [1, 5, 16, 33, 64, 256])
def test_pick_bucket_is_the_smallest_that_fits(max_num_seqs: int) -> None:
    buckets = graph_batch_sizes(max_num_seqs)
    for batch in range(1, max_num_seqs + 1):
        bucket = pick_bucket(batch, buckets)
        assert bucket in buckets and bucket >= batch
        assert all(b < batch for b in buckets if b < bucket)
    assert pick_bucket(max_num_seqs + 1, buckets) is None
    assert pick_bucket(0, buckets) is None


def test_table_width_rounds_blocks_up_to_16() -> None:
    assert table_width(1, 16) == 16
    assert table_width(256, 16) == 16
    assert table_width(257, 16) == 32
    assert table_width(16384, 16) == 1024


def test_engine_fallback_plain_families_capture() -> None:
    for family in ("llama", "mistral", "qwen2", "deepseek_v2", "deepseek_v3", "minimax"):
        assert engine_fallback_reason(device_type="cuda", family=family) is None


@pytest.mark.parametrize(
    ("change", "words"),
    [({"device_type": "cpu"}, "CUDA device"), ({"family": "gpt2"}, "family"), ({"family": "phi3"}, "family")],
)
def test_engine_fallback_reasons(change: dict, words: str) -> None:
    reason = engine_fallback_reason(**{"device_type": "cuda", "family": "llama", **change})
    assert reason is not None and words in reason


STEP = {"num_prefill_tokens": 0, "batch": 5, "bucket": 8, "width": 16, "static_width": 64, "hooked": False,
        "exact_pool_seqs": 0}


@pytest.mark.parametrize(
    ("change", "words"),
    [({}, None), ({"num_prefill_tokens": 7}, "prefill"), ({"bucket": None}, "exceeds the largest"),
     ({"width": 80}, "block table width"), ({"hooked": True}, "hook"), ({"width": 64}, None),
     ({"exact_pool_seqs": 1}, "1 sequence(s) on the fallback reserve"),
     ({"exact_pool_seqs": 5}, "5 sequence(s) on the fallback reserve"), ({"exact_pool_seqs": None}, "not counted")],
)
def test_step_fallback_reasons(change: dict, words: str | None) -> None:
    reason = step_fallback_reason(**{**STEP, **change})
    assert reason is None if words is None else words in reason


def test_has_forward_hooks_sees_module_and_global_hooks() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    modules = list(model.modules())
    assert not has_forward_hooks(modules)
    handle = model[1].register_forward_hook(lambda *_: None)
    assert has_forward_hooks(modules)
    handle.remove()
    handle = model[0].register_forward_pre_hook(lambda *_: None)
    assert has_forward_hooks(modules)
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda *_: None)
    try:
        assert has_forward_hooks(modules)
    finally:
        handle.remove()
    assert not has_forward_hooks(modules)


def decode_context(lens: list[int], tables: list[list[int]], width: int) -> Context:
    rows = torch.full((len(tables), width), -1, dtype=torch.int32)
    for i, t in enumerate(tables):
        rows[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    slots = torch.tensor([t[(n - 1) // 4] * 4 + (n - 1) % 4 for n, t in zip(lens, tables, strict=True)],
                         dtype=torch.int32)
    return Context(slot_mapping=slots, decode_context_lens=torch.tensor(lens, dtype=torch.int32),
                   decode_block_tables=rows)


def test_static_fill_pads_rows_to_the_bucket() -> None:
    static = StaticInputs.allocate(8, 32, torch.device("cpu"))
    assert static.width == 32
    # a previous, larger step leaves its rows behind
    big = decode_context([5, 6, 7, 8, 9, 10], [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10, 11], [12, 13, 14]], 16)
    static.fill(torch.arange(6), torch.arange(6) + 100, big, bucket=8)
    ctx = decode_context([3, 9, 1], [[20], [21, 22, 23], [24]], 16)
    static.fill(torch.tensor([7, 8, 9]), torch.tensor([2, 8, 0]), ctx, bucket=4)
    assert static.input_ids[:3].tolist() == [7, 8, 9] and static.positions[:3].tolist() == [2, 8, 0]
    assert static.slot_mapping[:4].tolist() == [*ctx.slot_mapping.tolist(), -1]  # padded row writes nothing
    assert static.context_lens[:4].tolist() == [3, 9, 1, 0]  # ... and attends to nothing
    assert static.block_tables[:3, :16].tolist() == ctx.decode_block_tables.tolist()
    graph_ctx = static.context(4)
    assert graph_ctx.num_prefill_tokens == 0 and not graph_ctx.is_prefill
    assert graph_ctx.slot_mapping.shape == (4,) and graph_ctx.decode_block_tables.shape == (4, 32)
    assert graph_ctx.decode_context_lens.data_ptr() == static.context_lens.data_ptr()  # views, not copies
    # every row a real one: nothing padded, nothing left of the earlier step inside the bucket
    full = decode_context([2, 2, 2, 2], [[30], [31], [32], [33]], 16)
    static.fill(torch.arange(4), torch.ones(4, dtype=torch.long), full, bucket=4)
    assert static.context_lens[:4].tolist() == [2, 2, 2, 2] and (static.slot_mapping[:4] >= 0).all()


def test_graphs_default_on_and_enforce_eager_turns_them_off() -> None:
    assert EngineConfig(model="m").cuda_graphs is True and EngineConfig(model="m").enforce_eager is False
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--model", "m"]).cuda_graphs is True
    assert parser.parse_args(["--model", "m", "--no-cuda-graphs"]).cuda_graphs is False
    assert parser.parse_args(["--model", "m", "--enforce-eager"]).enforce_eager is True


# -- the padded path on a CPU engine ------------------------------------------------------------
MAX_SEQS = 6  # buckets 1, 2, 4, 6: batches 3 and 5 are padded


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    return make_model(tmp_path_factory.mktemp("cuda-graphs") / "tiny", "llama", "tiny", num_key_value_heads=2)


def engine(path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), device="cpu", dtype="float32", block_size=8, num_kv_blocks=256,
                                  max_num_seqs=MAX_SEQS, show_progress=False, **kw))


def record_logits(eng: LLMEngine) -> list[torch.Tensor]:
    """Every step's logits, in order (a corrupted KV entry shows here before it flips a token)."""
    steps: list[torch.Tensor] = []
    compute = eng.runner.model.compute_logits

    def recorded(hidden: torch.Tensor) -> torch.Tensor:
        logits = compute(hidden)
        steps.append(logits.detach().clone())
        return logits

    eng.runner.model.compute_logits = recorded
    return steps


def test_cuda_graphs_flag_on_cpu_stays_eager(checkpoint) -> None:
    assert engine(checkpoint, cuda_graphs=True).runner.decode_graphs is None


@pytest.mark.parametrize(
    ("settings", "words"),
    [({}, None), ({"kv_cache_dtype": "int8"}, None), ({"kv_cache_dtype": "fp8"}, None),
     ({"kv_cache_dtype": "auto", "kv_quant_auto_threshold": 2}, "auto-switch"),
     ({"eviction": "sinks", "eviction_sinks": 8, "eviction_window": 32}, "eviction"),
     ({"attention": "linear"}, "recurrent"),
     ({"attention": "gqa", "kv_head_groups": 1, "fallback_reserve": 0.0}, None),
     ({"attention": "gqa", "kv_head_groups": 1, "fallback_reserve": 0.25}, "GQA conversion's fallback reserve")],
)
def test_each_strategy_says_whether_its_engine_replays_graphs(checkpoint, settings: dict, words: str | None) -> None:
    """The strategies' graph_blocker, asked through the registry, on real CPU engines seen as on CUDA."""
    runner = engine(checkpoint, **settings).runner
    reason = runner_fallback_reason(runner, device_type="cuda")
    assert (reason is None) if words is None else (reason is not None and words in reason), reason


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_8bit_cache_with_a_reserve_is_graphed_over_its_8bit_pool(checkpoint, kv: str) -> None:
    """The 16-bit fallback reserve no longer refuses graphs (only a device would); the static block table
    spans the 8-bit pool, where graphed sequences live, not the smaller reserve."""
    runner = engine(checkpoint, kv_cache_dtype=kv, fallback_reserve=0.25).runner
    n16, n8 = runner.kv_pool_sizes
    assert 0 < n16 < n8 and runner.first_approx_block == n16
    reason = runner_fallback_reason(runner, device_type="cuda")
    assert reason is None, reason
    max_len = min(runner.model_config.max_position_embeddings, n8 * 8)
    assert uncaptured_decode_graphs(runner).static.width == table_width(max_len, 8) > table_width(n16 * 8, 8)


@pytest.mark.parametrize("kv", ["auto", "int8", "fp8"])
def test_padded_static_forward_matches_eager_engine(checkpoint, kv: str) -> None:
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(3, 40))] for _ in range(MAX_SEQS)]
    lengths = [3, 12, 5, 9, 14, 7]  # requests finish at different steps: batches 6, 5, 4, 3, 2, 1
    eager = engine(checkpoint, kv_cache_dtype=kv)
    want_logits = record_logits(eager)
    want = engine_greedy(eager, prompts, lengths)
    eng = engine(checkpoint, kv_cache_dtype=kv)
    got_logits = record_logits(eng)
    runner = eng.runner
    static = StaticInputs.allocate(MAX_SEQS, table_width(256, 8), runner.device)
    graphs = DecodeGraphs(runner.model, static, graph_batch_sizes(MAX_SEQS), runner.model_config.hidden_size,
                          runner.dtype)
    runner.decode_graphs = graphs  # what a CUDA engine captures, run eagerly here
    got = engine_greedy(eng, prompts, lengths)
    assert got == want
    assert len(got_logits) == len(want_logits)
    for a, b in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert graphs.steps_total >= max(lengths) - 2 and graphs.replays_total == 0
    assert eng.block_manager.num_used_blocks == 0


def test_fp8_static_step_before_any_prefill_leaves_scales_uncalibrated(checkpoint) -> None:
    """Capture runs the static forward (all rows padding) before any prefill: it must neither calibrate the fp8
    scales on padding nor fail on an empty write; the first real prefill then calibrates as in eager."""
    eng = engine(checkpoint, kv_cache_dtype="fp8")
    runner = eng.runner
    layers = [m.kv_quant for m in runner.model.attention_layers()]
    before = [(q.k_scale.clone(), q.v_scale.clone()) for q in layers]
    graphs = DecodeGraphs(runner.model, StaticInputs.allocate(MAX_SEQS, table_width(256, 8), runner.device),
                          graph_batch_sizes(MAX_SEQS), runner.model_config.hidden_size, runner.dtype)
    with torch.inference_mode():
        for bucket in graphs.buckets:
            graphs._forward(bucket)  # what capture's warm-up and capture run
    for q, (k_scale, v_scale) in zip(layers, before, strict=True):
        assert not q.calibrated
        assert torch.equal(q.k_scale, k_scale) and torch.equal(q.v_scale, v_scale)
    runner.decode_graphs = graphs
    engine_greedy(eng, [[5, 6, 7, 8]], [4])
    assert all(q.calibrated for q in layers)
    assert graphs.steps_total >= 2 and eng.block_manager.num_used_blocks == 0
