"""Runtime validation: a bad approximation is caught, counted, and the sequence continues exactly."""

from __future__ import annotations

import logging

import pytest
import torch

from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.validation.runner import DenseRecompute, is_sampled
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import drain, engine_greedy, make_engine

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("validate") / "llama", "llama")


def engine(ckpt, **kw) -> LLMEngine:
    return make_engine(ckpt, **{"device": "cpu", "block_size": 16, "num_kv_blocks": 40, **kw})


def generate(eng: LLMEngine, prompt: list[int], n: int) -> list[int]:
    return engine_greedy(eng, [prompt], n, ["r"])[0]


def prompt_of(n: int) -> list[int]:
    return [(i * 37 + 11) % 370 + 3 for i in range(n)]


def test_eviction_below_threshold_falls_back_and_continues_exactly(ckpt, caplog):
    prompt, n, every = prompt_of(150), 30, 8
    eng = engine(
        ckpt, eviction="sinks", eviction_sinks=4, eviction_window=32, validate_every=every,
        validation_sample_rate=1.0, validation_threshold=0.9999, validation_layer=-1, fallback_reserve=0.5,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="kvpilot.engine.validation"):
        got = generate(eng, prompt, n)
    feed = eng.stats()["validation"]
    assert feed["checks_total"] == 1  # the sequence runs exactly after its first check
    assert feed["fallbacks_total"]["eviction"]["low_cosine"] == 1
    assert feed["reserve"]["blocks_total"] == 20 and feed["reserve"]["full_total"] == 0
    assert feed["last_cosine"] < 0.9999
    assert any("moving it to the exact path" in r.message for r in caplog.records)
    # The check ran on the step that produced completion token `every` (index every): from the
    # next token on, the sequence is recomputed without eviction and decodes over its full context.
    k = every + 1
    exact = generate(engine(ckpt), prompt + got[:k], n - k)
    assert got[k:] == exact
    evicted_only = generate(engine(ckpt, eviction="sinks", eviction_sinks=4, eviction_window=32), prompt, n)
    assert evicted_only[k:] != got[k:]  # without the fallback the tokens would have differed
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_a_sequence_too_long_for_the_reserve_is_served_on_and_counted_unrecovered(ckpt, caplog):
    """The default reserve (10% of 40 blocks: 4 blocks, 64 tokens) cannot hold a 180-token sequence."""
    eng = engine(
        ckpt, eviction="sinks", eviction_sinks=4, eviction_window=32, validate_every=8,
        validation_sample_rate=1.0, validation_threshold=0.9999, validation_layer=-1,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="kvpilot.engine.validation"):
        generate(eng, prompt_of(150), 30)
    feed = eng.stats()["validation"]
    assert feed["reserve"]["blocks_total"] == 4
    assert feed["checks_total"] == 3 and feed["unrecovered_total"] == {"eviction": 3}
    assert sum(feed["fallbacks_total"]["eviction"].values()) == 0
    assert any("no exact path to fall back to" in r.message for r in caplog.records)


def test_a_corrupted_approximation_plugs_in_and_falls_back(ckpt):
    class Corrupted(DenseRecompute):
        """Pretends every sequence is approximated and reports the negated exact output."""

        name = "corrupted"

        def __init__(self, runner):
            super().__init__(runner)
            self.fell_back: list[str] = []

        def applies(self, seq: Sequence) -> bool:
            return not seq.exact_path

        def exact_attention(self, seq, layer, num_tokens):
            return -super().exact_attention(seq, layer, num_tokens)

        def can_fall_back(self, seq):
            return True

        def fall_back(self, seq):
            seq.exact_path = True
            self.fell_back.append(seq.request_id)

    eng = engine(ckpt, validate_every=4, validation_sample_rate=1.0, validation_layer=0)
    check = Corrupted(eng.runner)
    eng.checks.add_check(check)
    plain = generate(engine(ckpt), prompt_of(20), 12)
    assert generate(eng, prompt_of(20), 12) == plain  # validating never changes an exact path's tokens
    feed = eng.stats()["validation"]
    assert check.fell_back == ["r"]
    assert feed["checks_total"] == 1 and feed["fallbacks_total"]["corrupted"]["low_cosine"] == 1
    assert feed["last_cosine"] == pytest.approx(-1.0, abs=1e-5)


def test_an_exact_side_out_of_memory_skips_the_check_and_serves_on(ckpt, caplog):
    """The dense recompute of a long sequence can exhaust device memory: the check is skipped and counted,
    the sequence keeps its path, nothing leaks, and the engine keeps serving."""

    class Exhausted(DenseRecompute):
        name = "exhausted"

        def applies(self, seq: Sequence) -> bool:
            return True

        def exact_attention(self, seq, layer, num_tokens):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.39 GiB")

        def can_fall_back(self, seq):
            return True

        def fall_back(self, seq):
            raise AssertionError("a skipped check must not move the sequence")

    eng = engine(ckpt, validate_every=4, validation_sample_rate=1.0, validation_layer=0)
    eng.checks.add_check(Exhausted(eng.runner))
    plain = generate(engine(ckpt), prompt_of(20), 12)
    with caplog.at_level("WARNING", logger="kvpilot.engine.validation"):
        assert generate(eng, prompt_of(20), 12) == plain
    feed = eng.stats()["validation"]
    assert feed["checks_skipped_total"] == 2 and feed["checks_total"] == 0  # tokens 4 and 8 of 12
    assert sum(feed["fallbacks_total"]["exhausted"].values()) == 0
    assert "ran out of device memory" in caplog.text
    assert eng.block_manager.num_used_blocks == 0


def test_native_engine_has_nothing_to_validate(ckpt):
    eng = engine(ckpt, validate_every=2, validation_sample_rate=1.0)
    generate(eng, prompt_of(10), 10)
    assert eng.stats()["validation"] == {
        "checks_total": 0,
        "fallbacks_total": {},
        "unrecovered_total": {},
        "last_cosine": None,
        "checks_skipped_total": 0,
        "reserve": {"blocks_total": 0, "blocks_used": 0, "sequences": 0, "full_total": 0},
    }


def test_sampling_is_per_request_and_proportional():
    ids = [f"req-{i}" for i in range(2000)]
    share = sum(is_sampled(r, 0.1) for r in ids) / len(ids)
    assert 0.07 < share < 0.13
    assert all(is_sampled(r, 0.1) == is_sampled(r, 0.1) for r in ids[:50])
    assert not any(is_sampled(r, 0.0) for r in ids) and all(is_sampled(r, 1.0) for r in ids)


def test_int8_cache_without_a_16bit_pool_is_checked_but_stays(ckpt, caplog):
    eng = engine(ckpt, kv_cache_dtype="int8", validate_every=4, validation_sample_rate=1.0,
                 validation_threshold=0.999999, validation_layer=-1, fallback_reserve=0.0)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="kvpilot.engine.validation"):
        generate(eng, prompt_of(40), 9)
    feed = eng.stats()["validation"]
    assert feed["checks_total"] == 2  # completion tokens 4 and 8
    assert sum(feed["fallbacks_total"]["kv_int8"].values()) == 0 and feed["unrecovered_total"] == {"kv_int8": 2}
    assert 0.999 < feed["last_cosine"] < 0.999999  # int8 K/V: close to, not equal to, the exact output
    assert any("no exact path" in r.message for r in caplog.records)


def test_auto_switched_int8_sequence_falls_back_to_the_16bit_pool(ckpt):
    eng = engine(ckpt, kv_cache_dtype="auto", kv_quant_auto_threshold=1, kv_quant_auto_hysteresis=0,
                 validate_every=4, validation_sample_rate=1.0, validation_threshold=0.999999,
                 validation_layer=-1)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    eng.add_request("first", prompt_of(30), params)  # batch 0 -> 16-bit pool
    eng.step()
    eng.add_request("second", prompt_of(25), params)  # batch 1 -> int8 pool
    out = drain(eng)
    feed = eng.stats()["validation"]
    assert feed["fallbacks_total"]["kv_int8"]["low_cosine"] == 1 and feed["checks_total"] == 1
    k = 5  # checked on the step producing completion token index 4; recomputed in 16-bit after
    assert out["second"][k:] == generate(engine(ckpt), prompt_of(25) + out["second"][:k], 12 - k)
