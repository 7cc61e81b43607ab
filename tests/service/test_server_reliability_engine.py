"""Issue 33 in this process, around a real engine: /tokenize and /detokenize take admission places,
admission counts sequences (n, best_of, batches) and echo+logprobs scoring, and an engine loop
that dies fails its requests and turns /health red."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvpilot.engine.server import ServerRuntime, ServerSettings, create_app

pytestmark = pytest.mark.service

MODEL = "tiny-llama"
MAX_NUM_SEQS, MAX_QUEUE = 4, 2  # admission holds 6 sequences


def _engine(tiny_model: Path) -> Any:
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(tiny_model), num_kv_blocks=128, max_model_len=256, max_num_seqs=MAX_NUM_SEQS,
                                  show_progress=False))  # fmt: skip


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Any:
    return _engine(tiny_model)


class Gated:
    """The real engine, whose tokenizer's encode and score_tokens wait while `hold` is set."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.tokenizer = _GatedTokenizer(engine.tokenizer, self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def wait_released(self) -> None:
        self.entered.set()
        deadline = 30.0
        while self.hold.is_set() and deadline > 0:
            threading.Event().wait(0.01)
            deadline -= 0.01

    def score_tokens(self, *args: Any) -> Any:
        self.wait_released()
        return self._engine.score_tokens(*args)


class _GatedTokenizer:
    def __init__(self, tokenizer: Any, gate: Gated) -> None:
        self._tokenizer = tokenizer
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def encode(self, *args: Any, **kw: Any) -> list[int]:
        self._gate.wait_released()
        return self._tokenizer.encode(*args, **kw)


def _runtime(engine: Any, **settings: Any) -> ServerRuntime:
    rt = ServerRuntime(ServerSettings(model_name=MODEL, strategy="test-strategy", max_queue=MAX_QUEUE, **settings),
                       lambda: engine)  # fmt: skip
    rt.start_loading()
    assert rt.wait_loaded(120), rt.failure
    return rt


@pytest.fixture
def gated(engine: Any) -> Iterator[tuple[ServerRuntime, Gated]]:
    gate = Gated(engine)
    rt = _runtime(gate, max_concurrent_scores=1)
    yield rt, gate
    gate.hold.clear()
    rt.shutdown()


def _client(runtime: ServerRuntime) -> httpx.AsyncClient:
    app = create_app(runtime, manage_engine=False)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process", timeout=60)


async def _until(condition: Any, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def test_tokenize_and_detokenize_take_admission_places_and_check_their_input(
    gated: tuple[ServerRuntime, Gated],
) -> None:
    # Item 5: /tokenize and /detokenize skipped every limit and admission; a lone surrogate gave 500.
    runtime, gate = gated
    async with _client(runtime) as client:
        gate.hold.set()
        pending = asyncio.create_task(client.post("/tokenize", json={"model": MODEL, "prompt": "hello"}))
        await asyncio.to_thread(gate.entered.wait, 10)
        assert runtime.admission.in_flight == 1  # the place is held while it tokenises
        gate.hold.clear()
        assert (await pending).status_code == 200 and runtime.admission.in_flight == 0
        bad = await client.post("/tokenize", content=b'{"prompt": "a\\ud800"}', headers={"content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_unicode", bad.text
        long = await client.post("/tokenize", json={"prompt": "x" * (runtime.admission.max_prompt_chars + 1)})
        assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded", long.text
        many = await client.post("/detokenize", json={"tokens": [5] * 257})
        assert many.status_code == 400 and "at most 256 (this model's maximum context length)" in many.text
        assert (await client.post("/detokenize", json={"tokens": [5, 6]})).status_code == 200


async def test_admission_counts_sequences_not_requests(gated: tuple[ServerRuntime, Gated]) -> None:
    # Item 7: 4 requests of best_of 128 x 2 prompts starved another stream 199.7 s with no 429.
    runtime, gate = gated
    body = {"model": MODEL, "prompt": "go", "max_tokens": 4, "temperature": 1.0, "seed": 1}
    async with _client(runtime) as client:
        gate.hold.set()
        first = asyncio.create_task(client.post("/v1/completions", json={**body, "n": 4}))
        await _until(lambda: runtime.admission.in_flight == 4)  # four places while it tokenises
        refused = await client.post("/v1/completions", json={**body, "best_of": 3})
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1", refused.text
        assert "4 sequences in flight" in refused.json()["error"]["message"] and "needs 3" in refused.text
        never = await client.post("/v1/completions", json={**body, "prompt": ["a", "b"], "n": 4})
        error = never.json()["error"]
        assert never.status_code == 400 and error["code"] == "too_many_sequences" and error["param"] == "n"
        assert "needs 8 sequences at once; this server holds at most 6" in error["message"]
        gate.hold.clear()
        done = await first
        assert done.status_code == 200 and len(done.json()["choices"]) == 4
        await _until(lambda: runtime.admission.in_flight == 0)


async def test_echo_with_logprobs_takes_a_scoring_place(gated: tuple[ServerRuntime, Gated]) -> None:
    # Item 7: echo + logprobs scores the prompt like /v1/score but ignored --max-concurrent-scores.
    runtime, gate = gated
    echo = {"model": MODEL, "prompt": "a b c d", "max_tokens": 0, "echo": True, "logprobs": 0}
    async with _client(runtime) as client:
        gate.hold.set()
        scoring = asyncio.create_task(client.post("/v1/score", json={"model": MODEL, "prompt": "a", "continuation": " b"}))
        await _until(lambda: runtime.admission.scores_in_flight == 1)
        refused = await asyncio.wait_for(client.post("/v1/completions", json=echo), 10)
        assert refused.status_code == 429 and "--max-concurrent-scores 1" in refused.text, refused.text
        assert runtime.admission.in_flight == 0  # its sequence place was given back
        gate.hold.clear()
        assert (await scoring).status_code == 200
        assert (await client.post("/v1/completions", json=echo)).status_code == 200
        await _until(lambda: runtime.admission.scores_in_flight == 0)


class _Fatal(BaseException):
    """Escapes every `except Exception`, as a fault in the loop's own error handling would."""


class _Dying:
    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def step(self) -> Any:
        self.steps += 1
        if self.steps == 3:
            raise _Fatal("the engine thread's last breath")
        return self._engine.step()


async def test_a_dead_engine_loop_fails_its_requests_and_turns_health_red(tiny_model: Path) -> None:
    # Item 9: after an exception escaped engine.step, in-flight requests hung and /health said ready.
    deaths: list[str] = []
    runtime = _runtime(_Dying(_engine(tiny_model)))
    runtime.loop._on_death = deaths.append
    body = {"model": MODEL, "prompt": "go", "max_tokens": 50, "ignore_eos": True}
    try:
        async with _client(runtime) as client:
            assert (await client.get("/health")).status_code == 200
            whole, streamed = await asyncio.wait_for(asyncio.gather(
                client.post("/v1/completions", json=body),
                client.post("/v1/completions", json={**body, "stream": True}),
            ), 30)  # fmt: skip
            assert whole.status_code == 500 and whole.json()["error"]["code"] == "internal_error", whole.text
            assert "engine loop died" in whole.json()["error"]["message"]
            assert '"error"' in streamed.text and "[DONE]" not in streamed.text
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "failed", health.text
            assert "the engine loop died (_Fatal)" in health.json()["detail"]
            assert (await client.get("/ready")).status_code == 503
            late = await asyncio.wait_for(client.post("/v1/completions", json=body), 10)
            assert late.status_code == 503 and "engine loop died" in late.text
            assert deaths and "_Fatal" in deaths[0]
            assert runtime.failed_total["engine_error"] == 2
    finally:
        runtime.shutdown()
