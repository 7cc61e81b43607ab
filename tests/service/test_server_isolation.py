"""The API app in this process around a real engine, with faults injected into the engine: one
request's failure is a 500 for it alone, the engine loop survives a failing step, and nothing
is served (503) until the engine has loaded and warmed up."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvpilot.engine.server import ServerRuntime, ServerSettings, create_app
from kvpilot.engine.server.runtime.warmup import warm_up

pytestmark = pytest.mark.service

MODEL = "tiny-llama"
POISON_ADD = 7  # a prompt ending with this token id is refused inside engine.add_request
POISON_STEP = 9  # a prompt ending with this token id makes engine.step() raise while it is inside


class FaultyEngine:
    """The real engine, except for the poisoned prompts above."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._step_poison: set[str] = set()
        self.score_gate: threading.Event | None = None  # when set: score() waits for it
        self.tokenizer = engine.tokenizer

    def score(self, prompt_token_ids: list[int], continuation_token_ids: list[int]) -> list[float]:
        if self.score_gate is not None:
            assert self.score_gate.wait(30), "the test never released the score"
        return self._engine.score(prompt_token_ids, continuation_token_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: Any) -> None:
        if prompt_token_ids[-1] == POISON_ADD:
            raise RuntimeError("injected failure in add_request")
        if prompt_token_ids[-1] == POISON_STEP:
            self._step_poison.add(request_id)
        self._engine.add_request(request_id, prompt_token_ids, params)

    def abort_request(self, request_id: str) -> None:
        self._step_poison.discard(request_id)
        self._engine.abort_request(request_id)

    def step(self) -> list[Any]:
        if self._step_poison:
            raise RuntimeError("injected failure in step")
        return self._engine.step()


@pytest.fixture(scope="module")
def real_engine(tiny_model: Path) -> Any:
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine

    return LLMEngine(
        EngineConfig(model=str(tiny_model), num_kv_blocks=128, max_model_len=256, show_progress=False)
    )


@pytest.fixture
def gate() -> threading.Event:
    return threading.Event()


class GatedTokenizer:
    """The real tokenizer, except that encode() waits for `release` (10 s at most)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def encode(self, text: str) -> list[int]:
        self.entered.set()
        self.release.wait(10)
        try:
            return self._tokenizer.encode(text)
        finally:
            self.finished.set()


@pytest.fixture
def faulty(real_engine: Any) -> FaultyEngine:
    return FaultyEngine(real_engine)


@pytest.fixture
def runtime(faulty: FaultyEngine, gate: threading.Event) -> Iterator[ServerRuntime]:
    """A runtime whose engine 'loads' until `gate` is set, then warms up like the real server."""

    def load() -> FaultyEngine:
        assert gate.wait(60), "the test never let the engine load"
        return faulty

    rt = ServerRuntime(ServerSettings(model_name=MODEL, strategy="test-strategy"), load, warm_up=warm_up)
    rt.start_loading()
    yield rt
    gate.set()
    rt.wait_loaded(60)
    rt.shutdown()


def _client(runtime: ServerRuntime) -> httpx.AsyncClient:
    app = create_app(runtime, manage_engine=False)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process", timeout=60)


def _completion(prompt: Any, max_tokens: int = 8) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}


async def test_not_ready_until_loaded_and_warmed_up(runtime: ServerRuntime, gate: threading.Event) -> None:
    async with _client(runtime) as client:
        assert (await client.get("/health")).status_code == 200
        ready = await client.get("/ready")
        assert ready.status_code == 503 and ready.headers["Retry-After"] == "5"
        assert ready.json()["status"] == "loading"
        assert ready.headers["X-Model-Strategy"] == "test-strategy"
        refused = await client.post("/v1/completions", json=_completion("hello"))
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
        error = refused.json()["error"]
        assert "not ready: the model weights are loading" in error["message"] and error["code"] == "not_ready"
        assert (
            await client.post("/v1/score", json={"model": MODEL, "prompt": "a", "continuation": "b"})
        ).status_code == 503

        gate.set()
        assert await asyncio.to_thread(runtime.wait_loaded, 120)
        assert runtime.warmup_seconds is not None and runtime.warmup_seconds > 0
        assert (await client.get("/ready")).status_code == 200
        served = await client.post("/v1/completions", json=_completion("hello"))
        assert served.status_code == 200, served.text


async def test_one_failing_request_does_not_disturb_the_others(
    runtime: ServerRuntime, gate: threading.Event
) -> None:
    gate.set()
    assert await asyncio.to_thread(runtime.wait_loaded, 120)
    async with _client(runtime) as client:
        before = (await asyncio.wrap_future(runtime.loop.call(lambda e: e.stats())))["requests"]
        healthy, poisoned = await asyncio.gather(
            client.post("/v1/completions", json=_completion([5, 6, 8], max_tokens=40)),
            client.post("/v1/completions", json=_completion([5, 6, POISON_ADD])),
        )
        assert poisoned.status_code == 500
        error = poisoned.json()["error"]
        assert error["type"] == "internal_error" and "injected failure in add_request" in error["message"]
        assert healthy.status_code == 200, healthy.text
        assert healthy.json()["usage"]["completion_tokens"] == 40
        again = await client.post("/v1/completions", json=_completion([5, 6, 8], max_tokens=40))
        assert again.json()["choices"][0]["text"] == healthy.json()["choices"][0]["text"]
        stats = await asyncio.wrap_future(runtime.loop.call(lambda e: e.stats()))
        assert (
            stats["requests"]["rejected_total"]["internal_error"]
            == before["rejected_total"]["internal_error"] + 1
        )
        assert runtime.failed_total["engine_error"] == 1
        assert (await runtime.stats())["requests"]["failed_total"]["engine_error"] == 1


async def test_engine_loop_survives_a_failing_step(runtime: ServerRuntime, gate: threading.Event) -> None:
    gate.set()
    assert await asyncio.to_thread(runtime.wait_loaded, 120)
    async with _client(runtime) as client:
        failed = await client.post("/v1/completions", json=_completion([5, 6, POISON_STEP]))
        assert failed.status_code == 500
        assert "injected failure in step" in failed.json()["error"]["message"]
        assert runtime.loop.alive and runtime.loop.step_failures == 1
        stats = await asyncio.wrap_future(runtime.loop.call(lambda e: e.stats()))
        assert stats["kv"]["blocks_used"] == 0 and stats["requests"]["running"] == 0
        after = await client.post("/v1/completions", json=_completion("still serving"))
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 8


async def test_a_failing_step_fails_the_new_request_not_the_running_ones(
    runtime: ServerRuntime, gate: threading.Event
) -> None:
    gate.set()
    assert await asyncio.to_thread(runtime.wait_loaded, 120)

    async def stats() -> dict[str, Any]:
        return await asyncio.wrap_future(runtime.loop.call(lambda e: e.stats()))

    async with _client(runtime) as client:
        undisturbed = await client.post("/v1/completions", json=_completion([5, 6, 8, 10], max_tokens=60))
        before = (await stats())["requests"]["generation_tokens_total"]
        running = asyncio.create_task(
            client.post("/v1/completions", json=_completion([5, 6, 8, 10], max_tokens=60))
        )
        while (await stats())["requests"]["generation_tokens_total"] < before + 5:
            await asyncio.sleep(0.01)
        failed = await client.post("/v1/completions", json=_completion([5, 6, POISON_STEP]))
        survivor = await running
    assert failed.status_code == 500 and "injected failure in step" in failed.json()["error"]["message"]
    assert survivor.status_code == 200, survivor.text
    assert survivor.json()["usage"]["completion_tokens"] == 60
    assert survivor.json()["choices"][0]["text"] == undisturbed.json()["choices"][0]["text"]
    assert runtime.loop.step_failures == 1


async def _ready(runtime: ServerRuntime, gate: threading.Event) -> None:
    gate.set()
    assert await asyncio.to_thread(runtime.wait_loaded, 120)


async def test_tokenising_runs_off_the_event_loop(
    runtime: ServerRuntime, gate: threading.Event, faulty: FaultyEngine
) -> None:
    # Finding 1: tokenisation on the event loop froze /health (and the stats feed) for 28 s.
    await _ready(runtime, gate)
    tokenizer = GatedTokenizer(faulty.tokenizer)
    faulty.tokenizer = tokenizer
    async with _client(runtime) as client:
        pending = asyncio.create_task(client.post("/v1/completions", json=_completion("a long prompt")))
        assert await asyncio.to_thread(tokenizer.entered.wait, 10)
        health = await client.get("/health")
        stats = await runtime.stats()
        assert not tokenizer.finished.is_set(), "the event loop waited for the tokenizer"
        assert health.status_code == 200 and stats is not None
        assert runtime.admission.in_flight == 1  # its place is taken before tokenising: the CPU work is bounded
        tokenizer.release.set()
        assert (await pending).status_code == 200


async def test_score_has_an_admission_limit(
    runtime: ServerRuntime, gate: threading.Event, faulty: FaultyEngine
) -> None:
    # Finding 2: /v1/score accepted every request; 24 long scores stalled a running stream.
    await _ready(runtime, gate)
    faulty.score_gate = threading.Event()
    body = {"model": MODEL, "prompt": "a b c", "continuation": " d"}
    limit = runtime.settings.max_concurrent_scores
    async with _client(runtime) as client:
        held = [asyncio.create_task(client.post("/v1/score", json=body)) for _ in range(limit)]
        while runtime.admission.scores_in_flight < limit:
            await asyncio.sleep(0.01)
        refused = await client.post("/v1/score", json=body)
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and f"--max-concurrent-scores {limit}" in error["message"]
        faulty.score_gate.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200] * limit
        assert runtime.admission.scores_in_flight == 0
        assert (await client.post("/v1/score", json=body)).status_code == 200


async def test_stats_feed_states_its_age_while_the_engine_is_busy(
    runtime: ServerRuntime, gate: threading.Event, faulty: FaultyEngine
) -> None:
    # Finding 3: a busy engine thread made the feed serve its last snapshot as fresh.
    await _ready(runtime, gate)
    fresh = await runtime.stats()
    assert fresh is not None and 0 <= fresh["age_seconds"] < 1.0
    faulty.score_gate = threading.Event()  # a score holds the engine thread
    async with _client(runtime) as client:
        scoring = asyncio.create_task(
            client.post("/v1/score", json={"model": MODEL, "prompt": "a", "continuation": " b"})
        )
        while runtime.admission.scores_in_flight < 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        stale = await runtime.stats()
        assert stale is not None and stale["age_seconds"] >= 1.0  # the wait, at least
        assert stale["taken_at_seconds"] <= fresh["taken_at_seconds"] + 0.5
        faulty.score_gate.set()
        assert (await scoring).status_code == 200
    again = await runtime.stats()
    assert again is not None and again["age_seconds"] < stale["age_seconds"]
    assert again["engine"]["model"] == MODEL  # the served name, not the checkpoint's path


async def test_out_of_memory_in_a_step_preempts_and_retries(
    runtime: ServerRuntime, gate: threading.Event, real_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    await _ready(runtime, gate)
    run = real_engine.runner.run
    ooms: list[int] = []

    def allocation_hook(scheduled: Any) -> Any:
        # What the CUDA caching allocator raises when a step's activations do not fit; here once,
        # on the first step that runs two sequences.
        if not ooms and len(scheduled.scheduled) >= 2:
            ooms.append(len(scheduled.scheduled))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated on CPU)")
        return run(scheduled)

    async with _client(runtime) as client:
        alone = await client.post("/v1/completions", json=_completion([5, 6, 8, 10], max_tokens=30))
        before = (await runtime.stats())["requests"]
        monkeypatch.setattr(real_engine.runner, "run", allocation_hook)
        both = await asyncio.gather(
            *(client.post("/v1/completions", json=_completion([5, 6, 8, 10], max_tokens=30)) for _ in range(2))
        )
    assert ooms, "the hook never saw two sequences in one step"
    assert [r.status_code for r in both] == [200, 200], [r.text for r in both]
    assert all(r.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"] for r in both)
    after = (await runtime.stats())["requests"]
    assert after["oom_events_total"] == before["oom_events_total"] + 1
    assert after["preemptions_total"] >= before["preemptions_total"] + 1
    assert runtime.loop.step_failures == 0 and runtime.loop.oom.recoveries == 1
    assert after["failed_total"]["engine_error"] == 0
