"""When a runtime-validation check is read: `same_step` decides it after its own step, `next_step` (the
default under async scheduling) after the step that follows, so the host never waits for the device there.
Same checks, same fallbacks, one step apart; a check still on its way counts once the stats are read."""

from __future__ import annotations

import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.parity

# every sequence is checked at its 4th decode token; a threshold of 1 fails every inexact check (8-bit KV)
KNOBS = {"kv_cache_dtype": "int8", "validate_every": 4, "validation_sample_rate": 1.0, "validation_threshold": 1.0,
         "max_num_seqs": 4, "max_num_batched_tokens": 64}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(make_model(tmp_path_factory.mktemp("verdict"), "llama"))


def engine_with(checkpoint: str, verdict: str, requests: int = 3, max_tokens: int = 12) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=checkpoint, device="cpu", show_progress=False, validation_verdict=verdict,
                                    **KNOBS))  # fmt: skip
    for i in range(requests):
        engine.add_request(f"r{i}", [5 + i, 9, 17, 33, 65], SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                          ignore_eos=True))  # fmt: skip
    return engine


def steps_to_first_count(engine: LLMEngine) -> tuple[int, int]:
    """(step at which checks were measured, step after which the first was counted)."""
    validation, measured, step = engine.checks.validation, None, 0
    while validation.checks_total == 0:
        step += 1
        engine.step()
        if measured is None and (validation._pending is not None or validation.checks_total):
            measured = step
    assert measured is not None
    return measured, step


def test_same_step_decides_after_its_step_and_next_step_after_the_following_one(checkpoint: str) -> None:
    same = engine_with(checkpoint, "same_step")
    later = engine_with(checkpoint, "next_step")
    assert not same.checks.validation.deferred and later.checks.validation.deferred
    measured, counted = steps_to_first_count(same)
    assert counted == measured  # decided in the step that measured it
    measured_later, counted_later = steps_to_first_count(later)
    assert measured_later == measured and counted_later == measured + 1
    fallbacks = later.checks.validation.fallbacks_total["kv_int8"]["low_cosine"]
    assert fallbacks == same.checks.validation.fallbacks_total["kv_int8"]["low_cosine"] == 3
    assert all(seq.exact_path for seq in later.scheduler.running) or not later.scheduler.running


def test_both_finish_every_request_with_the_same_checks_and_fallbacks(checkpoint: str) -> None:
    results = {}
    for verdict in ("same_step", "next_step"):
        engine = engine_with(checkpoint, verdict)
        finished = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
        stats = engine.stats()["validation"]
        results[verdict] = (sorted(finished), stats["checks_total"], stats["fallbacks_total"])
        assert engine.block_manager.num_used_blocks == 0  # no block leaked by a fallback decided late
    assert results["same_step"] == results["next_step"]
    assert results["next_step"][1] == 3


def test_a_check_of_the_last_step_counts_once_the_stats_are_read(checkpoint: str) -> None:
    # max_tokens 5: every sequence is checked in the step of its last token (its 5th), and no step follows
    engine = engine_with(checkpoint, "next_step", max_tokens=5)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["validation"]["checks_total"] == 3
    assert engine.checks.validation._pending is None


def test_the_warm_up_runs_the_exact_side_and_counts_nothing(checkpoint: str) -> None:
    engine = engine_with(checkpoint, "next_step")
    validation = engine.checks.validation
    calls = []
    check = validation.checks[0]
    original = check.exact_attention
    check.exact_attention = lambda seq, layer, n: calls.append(n) or original(seq, layer, n)
    validation.warm_up(lengths=(5, 9))
    assert calls == [5, 9]
    assert validation.checks_total == 0 and validation._pending is None
    assert engine.stats()["validation"]["checks_skipped_total"] == 0
