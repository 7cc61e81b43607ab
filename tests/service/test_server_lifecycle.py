"""A server with one running slot and one queue place: a full queue is a 429 with Retry-After and
loses nothing; SIGTERM lets in-flight streams finish, refuses new work, and exits 0."""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from tests.service.conftest import SERVED_MODEL, STRATEGY, ServerProcess

pytestmark = pytest.mark.service

LONG = {
    "model": SERVED_MODEL,
    "prompt": "hold the engine",
    "max_tokens": 120,
    "stream": True,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def small(start_server) -> ServerProcess:
    return start_server(
        "--max-model-len", "256", "--max-num-seqs", "1", "--max-queue", "1", "--cpu-memory-budget", "8MiB",
        "--shutdown-grace", "60",
    )  # fmt: skip


async def _drain(response: httpx.Response) -> list[str]:
    return [line async for line in response.aiter_lines() if line]


async def test_full_queue_is_429_with_retry_after(small: ServerProcess) -> None:
    async with (
        httpx.AsyncClient(base_url=small.base_url, timeout=120) as client,
        client.stream("POST", "/v1/completions", json=LONG) as running,
    ):
        assert running.status_code == 200
        async with client.stream("POST", "/v1/completions", json=LONG) as queued:
            assert queued.status_code == 200  # accepted into the queue: headers come at once
            rejected = await client.post("/v1/completions", json={**LONG, "stream": False})
            queued_lines = await _drain(queued)
        running_lines = await _drain(running)
    assert rejected.status_code == 429, rejected.text
    assert rejected.headers["Retry-After"] == "1"
    assert rejected.headers["X-Model-Strategy"] == STRATEGY
    error = rejected.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
    assert "at capacity" in error["message"] and "1 running, 1 queued" in error["message"]
    # nothing lost: both admitted requests ran to the end, and the server admits again afterwards
    assert running_lines[-1] == queued_lines[-1] == "data: [DONE]"
    assert small.stats()["requests"]["rejected_total"]["queue_full"] == 1
    after = httpx.post(small.base_url + "/v1/completions", json={**LONG, "stream": False, "max_tokens": 3})
    assert after.status_code == 200, after.text


async def test_sigterm_drains_in_flight_streams_and_exits_0(small: ServerProcess) -> None:
    async with (
        httpx.AsyncClient(base_url=small.base_url, timeout=120) as client,
        client.stream("POST", "/v1/completions", json=LONG) as response,
    ):
        assert response.status_code == 200
        lines = []
        async for line in response.aiter_lines():
            if line:
                lines.append(line)
            if len(lines) == 2:
                small.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                with pytest.raises(httpx.HTTPError):  # the listener is closed: no new work
                    await client.post("/v1/completions", json={**LONG, "stream": False})
        assert lines[-1] == "data: [DONE]", "the in-flight stream was cut instead of drained"
    assert await asyncio.to_thread(small.proc.wait, 60) == 0
