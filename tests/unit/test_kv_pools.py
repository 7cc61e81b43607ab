"""kv_cache_dtype=auto: the two-pool block manager under the real Scheduler (torch-free), and the
strategy settings (validation, one-flag rollback, names)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.config.strategy import kv_cache_kind, strategy_label
from kvpilot.engine.core.scheduler import Scheduler
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.strategies.kv_quant.pools import POOL8, POOL16, PooledBlockManager

pytestmark = pytest.mark.unit


def seq(name: str, n: int, max_tokens: int = 4, base: int = 1) -> Sequence:
    return Sequence(name, [base + (i % 50) for i in range(n)], SamplingParams(temperature=0, max_tokens=max_tokens))


def scheduler(bm: PooledBlockManager, max_num_seqs: int = 16, budget: int = 64) -> Scheduler:
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                     max_model_len=min(p.num_blocks for p in bm.pools.values()) * bm.block_size)


def step(sched: Scheduler, rng: random.Random) -> None:
    out = sched.schedule()
    sched.postprocess(out, [rng.randrange(1, 100) if s.samples else None for s in out.scheduled])


def check_invariants(bm: PooledBlockManager, sched: Scheduler) -> None:
    held: dict[str, set[int]] = {POOL16: set(), POOL8: set()}
    for s in sched.running:
        pool = bm.pools[bm.pool_of(s)]
        assert all(pool.first_block_id <= b < pool.first_block_id + pool.num_blocks for b in s.block_table)
        held[bm.pool_of(s)].update(s.block_table)
    for name, pool in bm.pools.items():
        assert pool.used_block_ids == held[name], name
        assert pool.num_used_blocks + pool.num_free_blocks == pool.num_blocks
    assert set(bm._bound) == {s.request_id for s in sched.running if s.block_table}


def test_new_sequences_switch_at_the_threshold_with_hysteresis():
    bm = PooledBlockManager(64, 64, block_size=4, threshold=3, hysteresis=1)
    seqs = [seq(f"s{i}", 5) for i in range(5)]
    for s in seqs:
        bm.allocate(s, len(s))
    # running 0, 1, 2 -> 16-bit; at 3 and above -> 8-bit
    assert [bm.pool_of(s) for s in seqs] == [POOL16] * 3 + [POOL8] * 2
    assert bm.sequences_per_pool() == {POOL16: 3, POOL8: 2}
    assert all(b >= 64 for s in seqs[3:] for b in s.block_table)
    bm.deallocate(seqs[4])
    bm.deallocate(seqs[3])  # running 3: not below threshold - hysteresis = 2, still 8-bit
    assert bm.pool_of(seq("new", 3)) == POOL8
    bm.deallocate(seqs[2])
    assert bm.pool_of(seq("new", 3)) == POOL8  # running 2: still not below 2
    bm.deallocate(seqs[1])  # running 1 < 2: back to 16-bit
    assert bm.pool_of(seq("new", 3)) == POOL16
    assert bm.switches_total == 2


def test_a_batch_crossing_the_threshold_puts_later_sequences_on_8bit_blocks():
    bm = PooledBlockManager(40, 80, block_size=4, threshold=4, hysteresis=1)
    sched = scheduler(bm)
    for i in range(10):
        sched.add(seq(f"r{i}", 6, max_tokens=3))
    rng = random.Random(0)
    step(sched, rng)
    first = {s.request_id: bm.pool_of(s) for s in sched.running}
    assert [first[f"r{i}"] for i in range(10)] == [POOL16] * 4 + [POOL8] * 6
    while sched.has_unfinished():
        step(sched, rng)
        check_invariants(bm, sched)
    assert bm.num_used_blocks == 0 and not bm._bound
    for pool in bm.pools.values():
        assert pool.num_free_blocks == pool.num_blocks


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    threshold=st.integers(1, 6),
    hysteresis=st.integers(0, 3),
    blocks=st.tuples(st.integers(8, 40), st.integers(8, 40)),
    caching=st.booleans(),
)
def test_random_add_abort_step_leaks_no_block_in_either_pool(seed, threshold, hysteresis, blocks, caching):
    rng = random.Random(seed)
    bm = PooledBlockManager(*blocks, block_size=4, enable_prefix_caching=caching,
                            threshold=threshold, hysteresis=hysteresis)
    sched = scheduler(bm, max_num_seqs=8, budget=24)
    live: list[str] = []
    for n in range(60):
        action = rng.random()
        if action < 0.35:
            length = rng.randrange(1, min(p.num_blocks for p in bm.pools.values()) * 4 - 8)
            sched.add(seq(f"q{n}", length, max_tokens=rng.randrange(1, 8), base=rng.choice((1, 7))))
            live.append(f"q{n}")
        elif action < 0.45 and live:
            sched.abort(live.pop(rng.randrange(len(live))))
        step(sched, rng)
        check_invariants(bm, sched)
    for rid in live:
        sched.abort(rid)
    assert bm.num_used_blocks == 0 and not bm._bound
    for pool in bm.pools.values():
        assert pool.num_free_blocks == pool.num_blocks and not pool.used_block_ids


def test_disable_flags_change_only_their_field():
    base = EngineConfig(model="m", attention="gqa", kv_head_groups=2, kv_cache_dtype="int8")
    for flag in ("disable_gqa", "disable_kv_quant"):
        off = dataclasses.replace(base, **{flag: True})
        diff = {f.name for f in dataclasses.fields(base) if getattr(base, f.name) != getattr(off, f.name)}
        assert diff == {flag}
    assert kv_cache_kind(base) == "int8"
    assert kv_cache_kind(dataclasses.replace(base, disable_kv_quant=True)) == "model"
    assert kv_cache_kind(EngineConfig(model="m", kv_cache_dtype="float16", disable_kv_quant=True)) == "float16"
    assert kv_cache_kind(EngineConfig(model="m")) == "model"  # the default is today's cache
    assert kv_cache_kind(EngineConfig(model="m", kv_quant_auto_threshold=32)) == "auto-switch"


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({}, "native-bf16"),
        ({"kv_cache_dtype": "int8", "attention": "gqa", "kv_head_groups": 4}, "gqa4-int8"),
        ({"kv_cache_dtype": "fp8", "attention": "gqa", "kv_head_groups": 4, "disable_gqa": True}, "native-fp8"),
        ({"kv_cache_dtype": "int8", "disable_kv_quant": True}, "native-bf16"),
        ({"kv_cache_dtype": "fp16"}, "native-fp16"),
        ({"kv_quant_auto_threshold": 32}, "native-auto32"),
    ],
)
def test_strategy_names(kw, name):
    assert strategy_label(EngineConfig(model="m", **kw), "bfloat16") == name


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype 'int4' is not supported"),
        ({"kv_cache_dtype": "int8", "kv_quant_auto_threshold": 8}, "applies to kv_cache_dtype='auto' only"),
        ({"kv_quant_auto_threshold": 0}, "must be >= 1"),
        ({"kv_quant_auto_split": 1.0}, r"must be in \(0, 1\)"),
        ({"attention": "sparse"}, "attention 'sparse' is not supported"),
    ],
)
def test_invalid_settings_say_what_is_allowed(kw, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **kw)


def test_serve_cli_accepts_the_new_flags():
    import argparse

    from kvpilot.engine.server.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "m", "--attention", "gqa", "--kv-head-groups", "4", "--kv-cache-dtype",
                              "fp8", "--disable-gqa", "--disable-kv-quant", "--kv-quant-auto-threshold", "32"])
    assert (args.kv_head_groups, args.kv_cache_dtype, args.disable_gqa, args.disable_kv_quant) == (4, "fp8", True, True)
    assert args.kv_quant_auto_threshold == 32
    for kv in ("auto", "bf16", "bfloat16", "fp16", "float16", "float32", "int8", "fp8"):
        assert parser.parse_args(["--model", "m", "--kv-cache-dtype", kv]).kv_cache_dtype == kv


def _serve_prepare(tmp_path, *flags):
    import argparse
    import json

    from kvpilot.engine.make_model import model_config
    from kvpilot.engine.server.cli import _prepare, add_arguments

    (tmp_path / "config.json").write_text(json.dumps(model_config("llama", "small", num_key_value_heads=4)))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return _prepare(parser.parse_args(["--model", str(tmp_path), "--device", "cpu", *flags]))


def test_serve_plans_the_pool_and_names_the_strategy(tmp_path):
    """The capacity plan sizes the pool in the strategy's own blocks: int8 and fp8 blocks are smaller, so
    more fit the same memory; GQA halves the KV heads; the disable flags restore the 16-bit native plan."""
    runs = {
        "bf16": (), "int8": ("--kv-cache-dtype", "int8"), "fp8": ("--kv-cache-dtype", "fp8"),
        "gqa2-int8": ("--attention", "gqa", "--kv-head-groups", "2", "--kv-cache-dtype", "int8"),
        "off": ("--attention", "gqa", "--kv-head-groups", "2", "--kv-cache-dtype", "int8", "--disable-gqa",
                "--disable-kv-quant"),
        "auto": ("--kv-quant-auto-threshold", "32",),
    }
    got = {name: _serve_prepare(tmp_path, *flags) for name, flags in runs.items()}
    names = {name: settings.strategy for name, (_, settings, _) in got.items()}
    blocks = {name: config.num_kv_blocks for name, (config, _, _) in got.items()}
    assert names == {"bf16": "native-bf16", "int8": "native-int8", "fp8": "native-fp8", "gqa2-int8": "gqa2-int8",
                     "off": "native-bf16", "auto": "native-auto32"}
    assert blocks["off"] == blocks["bf16"] == blocks["auto"]  # auto plans the 16-bit budget, then splits it
    assert blocks["int8"] > blocks["bf16"] and blocks["fp8"] > blocks["bf16"]
    assert blocks["gqa2-int8"] > blocks["int8"]
