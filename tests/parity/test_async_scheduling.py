"""Async scheduling (host/GPU overlap) gives the tokens, texts and finish reasons of the synchronous engine:
stop strings and stop ids, preemption, prefix caching, seeded sampling, and the steps that must read the
tokens first (penalties, log-probabilities, structured output) falling back to synchronous steps."""

from __future__ import annotations

import random

import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.structured.spec import StructuredSpec

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(make_model(tmp_path_factory.mktemp("async"), "llama"))


def run(checkpoint: str, mode: str, requests: list[tuple[list[int], SamplingParams]], device: str = "cpu",
        **knobs) -> tuple[dict, LLMEngine]:  # fmt: skip
    """Every request's generated ids, finish reason and text, and the engine that made them."""
    engine = LLMEngine(EngineConfig(model=checkpoint, device=device, async_scheduling=mode, show_progress=False,
                                    max_num_seqs=6, max_num_batched_tokens=64, **knobs))  # fmt: skip
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(f"r{i}", prompt, params)
    got: dict[str, dict] = {f"r{i}": {"ids": []} for i in range(len(requests))}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            got[out.request_id]["ids"] += out.new_token_ids
            if out.finished:
                got[out.request_id].update(reason=out.finish_reason, text=out.text)
    assert not engine.has_unfinished_requests()
    return got, engine


def workload(seed: int = 0) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 384) for _ in range(40)]  # prefix-cache hits for the later requests
    requests = []
    for i in range(14):
        prompt = (shared if i % 2 else []) + [rng.randrange(3, 384) for _ in range(rng.randrange(1, 30))]
        if i % 3 == 0:
            params = SamplingParams(temperature=0.0, max_tokens=rng.randrange(1, 40), ignore_eos=True)
        elif i % 3 == 1:
            params = SamplingParams(temperature=1.0, seed=100 + i, max_tokens=rng.randrange(5, 40), ignore_eos=True)
        else:
            params = SamplingParams(temperature=0.8, top_k=20, seed=i, max_tokens=30, ignore_eos=True, min_tokens=4)
        requests.append((prompt, params))
    return requests


def with_stops(requests, reference: dict) -> list[tuple[list[int], SamplingParams]]:
    """Stop strings and stop token ids taken from a first run's outputs, so they hit mid-way."""
    out = []
    for i, (prompt, params) in enumerate(requests):
        got = reference[f"r{i}"]
        if i % 4 == 1 and len(got["text"]) > 12:
            params.stop = [got["text"][6:9]]
        elif i % 4 == 2 and len(got["ids"]) > 6:
            params.stop_token_ids = [got["ids"][5]]
        out.append((prompt, params))
    return out


def test_async_scheduling_gives_the_synchronous_outputs(checkpoint: str) -> None:
    first, _ = run(checkpoint, "off", workload())
    requests = with_stops(workload(), first)
    # a small pool: running sequences are preempted and recomputed
    sync, sync_engine = run(checkpoint, "off", requests, num_kv_blocks=12)
    overlapped, engine = run(checkpoint, "on", requests, num_kv_blocks=12)
    assert engine.async_scheduling and not sync_engine.async_scheduling
    assert overlapped == sync
    assert {o["reason"] for o in sync.values()} == {"stop", "length"}
    assert engine.scheduler.num_preemptions > 0 and engine.block_manager.prefix_hit_tokens > 0
    assert engine.block_manager.num_used_blocks == 0  # nothing leaked by the dropped extra steps


def test_steps_that_read_their_tokens_fall_back(checkpoint: str, monkeypatch) -> None:
    requests = workload(1)[:6]
    requests[1][1].presence_penalty = 0.5
    requests[2][1].logprobs = 2
    requests[3] = (requests[3][0], SamplingParams(temperature=0.0, max_tokens=12,
                                                  structured=StructuredSpec("choice", ("alpha", "beta"))))
    sync, _ = run(checkpoint, "off", requests)
    launched: list[int] = []
    original = LLMEngine._step_async

    def counting(self):
        before = self._inflight
        out = original(self)
        launched.append(self._inflight is not None and self._inflight is not before)
        return out

    monkeypatch.setattr(LLMEngine, "_step_async", counting)
    overlapped, _ = run(checkpoint, "on", requests)
    assert overlapped == sync
    assert overlapped["r3"]["text"] in ("alpha", "beta")
    assert any(launched) and not all(launched)  # overlapped steps once only plain requests are left


def test_auto_is_off_on_cpu(checkpoint: str) -> None:
    _, engine = run(checkpoint, "auto", workload()[:2])
    assert not engine.async_scheduling


@pytest.mark.parametrize(
    "knobs",
    [
        # 8-bit KV with runtime validation on every sequence every 4 tokens; a threshold of 1 fails each inexact check,
        # so sequences fall back (requeued, recomputed exactly) right after the step that launched
        # (both engines read a check after the next step's launch, as async scheduling does by default)
        {"kv_cache_dtype": "int8", "validate_every": 4, "validation_sample_rate": 1.0, "validation_threshold": 1.0,
         "validation_verdict": "next_step"},
        {"eviction": "sinks", "eviction_sinks": 4, "eviction_window": 32},  # block tables rewritten after steps
        {"attention": "mla", "latent_rank": 16},  # MLA conversion (SVD latent cache)
        {"attention": "gqa", "kv_head_groups": 1},  # K/V heads merged at load
    ],
    ids=["int8-validation-fallbacks", "eviction", "mla-conversion", "gqa"],
)
def test_async_scheduling_with_runtime_guards_and_eviction(checkpoint: str, knobs: dict) -> None:
    requests = workload(2)
    sync, sync_engine = run(checkpoint, "off", requests, **knobs)
    overlapped, engine = run(checkpoint, "on", requests, **knobs)
    assert engine.async_scheduling
    assert overlapped == sync
    if "kv_cache_dtype" in knobs:
        assert engine.stats()["validation"] == sync_engine.stats()["validation"]
        assert sum(sum(v.values()) for v in engine.checks.validation.fallbacks_total.values()) > 0
