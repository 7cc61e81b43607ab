"""Tensor parallelism on CPU (gloo, torch.multiprocessing): two and four ranks give HF's greedy tokens.

Llama with KV heads split over the ranks and copied (fewer KV heads than ranks), Qwen2 (q/k/v bias), with
prefix caching and a pool small enough to force preemption; the strategies that must work under TP
(8-bit KV, eviction, runtime validation, GQA conversion) give the single-rank engine's tokens; the
capacity planner's figures are the running engine's. Every engine here is shut down by the test that
started it (its ranks are processes), also when an assertion fails.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpilot.engine.llm import LLM
from kvpilot.engine.server.runtime.capacity_plan import plan_for
from kvpilot.planner import DEFAULT_WATERMARK
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import assert_replay_and_release, greedy_ids, hf_reference_fixture, mixed_prompts

pytestmark = pytest.mark.parity

MAX_NEW = 8
PROMPTS = mixed_prompts()
VARIANTS = {  # name -> (family, num_key_value_heads, vocab_size); the tiny models have 4 query heads
    "llama-kv2": ("llama", 2, 384),
    "llama-kv1": ("llama", 1, 384),
    "qwen2-kv2": ("qwen2", 2, 385),  # an odd vocabulary: the last rank's share is zero-padded
}
PREEMPT = {
    "num_kv_blocks": 10,
    "block_size": 8,
}  # a pool this small preempts (tests/parity/test_engine_parity.py)


def build(out_dir: Path, name: str) -> Path:
    family, kv_heads, vocab = VARIANTS[name]
    return build_hf_checkpoint(out_dir, family, seed=len(name) + 7, num_key_value_heads=kv_heads, vocab_size=vocab)


checkpoint = hf_reference_fixture(build, PROMPTS, MAX_NEW)


def tp_ranks() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("kvpilot-tp-rank")]


@contextlib.contextmanager
def engine(path: str, **kw) -> Iterator[LLM]:
    llm = LLM(path, show_progress=False, **kw)
    try:
        yield llm
    finally:
        llm.engine.shutdown()
    assert not tp_ranks()


@pytest.mark.parametrize(
    ("checkpoint", "kv_per_rank"),
    [("llama-kv2", 1), ("llama-kv1", 1), ("qwen2-kv2", 1)],
    indirect=["checkpoint"],
)
def test_two_ranks_match_hf_with_prefix_caching_and_preemption(checkpoint, kv_per_rank: int) -> None:
    path, expected = checkpoint
    with engine(path, tensor_parallel_size=2, **PREEMPT) as llm:
        runner = llm.engine.runner
        assert runner.kv_cache.shape[-2] == kv_per_rank  # this rank's share (llama-kv1: the one head, copied)
        assert runner.model.model.layers[0].self_attn.num_heads == 2
        assert greedy_ids(llm, PROMPTS, MAX_NEW) == expected
        assert llm.engine.scheduler.num_preemptions > 0, "the tiny pool was meant to force preemption"
        assert_replay_and_release(llm, PROMPTS, expected, MAX_NEW)


@pytest.mark.parametrize("checkpoint", ["llama-kv2"], indirect=True)
def test_four_ranks_copy_kv_heads_match_hf_and_the_planner(checkpoint) -> None:
    """2 KV heads over 4 ranks: each rank caches one, copied twice; the planner counts the copies."""
    path, expected = checkpoint
    budget = 2 * 2**20
    with engine(path, tensor_parallel_size=4, cpu_kv_cache_bytes=budget, max_num_seqs=8) as llm:
        eng = llm.engine
        assert eng.runner.kv_cache.shape[-2] == 1 and eng.runner.world == 4
        assert greedy_ids(llm, PROMPTS, MAX_NEW) == expected
        assert_replay_and_release(llm, PROMPTS, expected, MAX_NEW)
        plan = plan_for(eng.config, "cpu", budget, DEFAULT_WATERMARK)
        kv = eng.stats()["kv"]
        rank_bytes = eng.runner.kv_cache.numel() * eng.runner.kv_cache.element_size()
        # per token and all ranks: 2 (K, V) x 2 layers x 4 cached heads (2 heads, each on 2 ranks) x 16 x 4 bytes
        assert plan.bytes_per_token == 2 * 2 * 4 * 16 * 4
        assert (
            plan.gpus == 4
            and plan.block_bytes == kv["bytes_per_block"] == 4 * rank_bytes // kv["blocks_total"]
        )
        assert kv["blocks_total"] == budget // (kv["bytes_per_block"] // 4)  # each rank's budget, its share


@pytest.mark.parametrize("checkpoint", ["llama-kv2"], indirect=True)
@pytest.mark.parametrize(
    "strategy",
    [
        # int8 KV, attention sinks + window eviction, runtime validation on every decode of every sequence
        {"kv_cache_dtype": "int8", "eviction": "sinks", "eviction_sinks": 4, "eviction_window": 16,
         "validate_every": 1, "validation_sample_rate": 1.0},
        # GQA conversion to one KV head (copied to both ranks) with an fp8 cache
        {"attention": "gqa", "kv_head_groups": 1, "kv_cache_dtype": "fp8"},
        # 16-bit and int8 pools, new sequences switching to int8 from 2 running
        {"kv_cache_dtype": "auto", "kv_quant_auto_threshold": 2},
    ],
    ids=["int8-eviction-validation", "gqa1-fp8", "auto-switch"],
)  # fmt: skip
def test_strategies_under_two_ranks_match_one_rank(checkpoint, strategy: dict) -> None:
    path, _ = checkpoint
    one = LLM(path, show_progress=False, **strategy)
    want = greedy_ids(one, PROMPTS, MAX_NEW)
    want_scores = one.engine.score(PROMPTS[3], PROMPTS[2])
    with engine(path, tensor_parallel_size=2, **strategy) as llm:
        assert greedy_ids(llm, PROMPTS, MAX_NEW) == want
        got_scores = llm.engine.score(PROMPTS[3], PROMPTS[2])
        assert max(abs(a - b) for a, b in zip(got_scores, want_scores, strict=True)) < 1e-3
        stats = llm.engine.stats()
        if "kv_quant_auto_threshold" in strategy:  # new sequences did switch to the int8 pool
            assert llm.engine.block_manager.switches_total > 0
        if "validate_every" in strategy:
            assert stats["validation"]["checks_total"] > 0 and stats["validation"]["last_cosine"] > 0.92
            assert stats["validation"]["checks_total"] == one.engine.stats()["validation"]["checks_total"]


def test_refused_before_any_rank_starts(tmp_path: Path) -> None:
    path = build_hf_checkpoint(tmp_path / "m", "llama", num_key_value_heads=2)
    with pytest.raises(ValueError, match="attention='mla' is not available with tensor_parallel_size=2"):
        LLM(str(path), attention="mla", latent_rank=8, tensor_parallel_size=2)
    with pytest.raises(
        ValueError, match=r"tensor_parallel_size=3 must divide num_attention_heads=4.*\[1, 2, 4\]"
    ):
        LLM(str(path), tensor_parallel_size=3)
    assert not tp_ranks()


@pytest.mark.parametrize("checkpoint", ["llama-kv1"], indirect=True)
def test_a_hung_rank_times_out_and_fails_closed(checkpoint) -> None:
    """A rank that stops answering (SIGSTOP) is not waited on forever: the collective times out and the
    engine refuses every later call with the reason, and says so once through on_fatal."""
    import os
    import signal
    import time

    from kvpilot.engine.llm_engine import LLMEngine
    from kvpilot.engine.parallel.driver import TensorParallelError
    from kvpilot.engine.sampling_params import SamplingParams
    from tests.parity.helpers import make_engine

    path, _ = checkpoint
    fatal: list[str] = []
    eng: LLMEngine = make_engine(path, tensor_parallel_size=2, tensor_parallel_timeout=10.0)
    eng.tp.driver.on_fatal = fatal.append
    (rank1,) = eng.tp.procs
    try:
        eng.add_request("a", PROMPTS[2], SamplingParams(max_tokens=4))
        eng.step()
        os.kill(rank1.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(TensorParallelError, match="failing closed"):
            eng.step()  # stuck sending the call (the watchdog kills the rank) or in a collective (it times out)
        assert time.monotonic() - started < 60  # the 10 s timeout, on a loaded machine
        assert len(fatal) == 1 and "failing closed" in fatal[0]
        with pytest.raises(TensorParallelError, match="failing closed"):
            eng.step()  # no second wait: refused at once
        assert not rank1.is_alive()  # failing closed stops the other ranks
    finally:
        if rank1.is_alive():
            rank1.kill()
        eng.shutdown()



@pytest.mark.parametrize("checkpoint", ["llama-kv2"], indirect=True)
def test_rank_zero_failing_to_start_leaves_no_rank_behind(checkpoint, monkeypatch) -> None:
    """Rank 0 fails after the others joined (they wait in a collective): the start fails with that error
    at once, and the other ranks are stopped (spawned ranks do not see this monkeypatch)."""
    from kvpilot.engine.worker.model_runner import ModelRunner

    def fail(_self):
        raise RuntimeError("no memory for the KV pool (test)")

    monkeypatch.setattr(ModelRunner, "_size_kv_pool", fail)
    with pytest.raises(RuntimeError, match="no memory for the KV pool"):
        LLM(checkpoint[0], show_progress=False, tensor_parallel_size=2)
    assert not tp_ranks()
