"""Streams under load and clients that leave: a disconnect aborts the sequence and frees its KV
blocks at once; 64 concurrent streams all finish and leave no block behind."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service

LONG_STREAM = {
    "model": SERVED_MODEL,
    "prompt": "A client that goes away mid-stream",
    "max_tokens": 220,
    "ignore_eos": True,
    "stream": True,
}


def _idle(stats: dict) -> bool:
    return (
        stats["kv"]["blocks_used"] == 0
        and stats["requests"]["running"] == 0
        and stats["requests"]["waiting"] == 0
    )


async def test_disconnect_mid_stream_aborts_and_frees_blocks(server: ServerProcess) -> None:
    before = server.wait_stats(_idle)
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=60) as client,
        client.stream("POST", "/v1/completions", json=LONG_STREAM) as response,
    ):
        assert response.status_code == 200
        received = 0
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                received += 1
            if received == 3:
                break
        during = server.stats()
        assert during["kv"]["blocks_used"] >= 1
        assert during["requests"]["running"] == 1
        # leaving the block closes the connection with the stream unfinished
    after = server.wait_stats(
        lambda s: s["requests"]["aborted_total"] > before["requests"]["aborted_total"], 5
    )
    after = server.wait_stats(_idle, 5)
    assert after["requests"]["aborted_total"] == before["requests"]["aborted_total"] + 1
    assert after["requests"]["finished_total"] == before["requests"]["finished_total"]
    assert after["requests"]["generation_tokens_total"] - before["requests"]["generation_tokens_total"] < 220


async def test_disconnect_while_waiting_for_a_whole_completion_aborts_it(server: ServerProcess) -> None:
    before = server.wait_stats(_idle)
    body = {**LONG_STREAM, "stream": False}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        task = asyncio.create_task(client.post("/v1/completions", json=body))
        server_side = await asyncio.to_thread(server.wait_stats, lambda s: s["requests"]["running"] == 1, 10)
        assert server_side["kv"]["blocks_used"] >= 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    after = await asyncio.to_thread(server.wait_stats, _idle, 5)
    assert after["requests"]["aborted_total"] == before["requests"]["aborted_total"] + 1


async def test_64_concurrent_streams_finish_without_error_or_leaked_blocks(server: ServerProcess) -> None:
    before = server.wait_stats(_idle)
    n, max_tokens = 64, 12

    async def one(client: httpx.AsyncClient, i: int) -> tuple[str, str | None]:
        body = {
            "model": SERVED_MODEL,
            "messages": [{"role": "user", "content": f"stream number {i}"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        text, finish = "", None
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200, await response.aread()
            lines = [line async for line in response.aiter_lines() if line]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        for line in lines[:-1]:
            chunk = json.loads(line.removeprefix("data: "))
            assert "error" not in chunk, chunk
            text += chunk["choices"][0]["delta"].get("content") or ""
            finish = chunk["choices"][0]["finish_reason"] or finish
        return text, finish

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(n)))
    assert [finish for _, finish in results] == ["length"] * n
    after = server.wait_stats(_idle, 10)
    assert after["kv"]["blocks_used"] == 0
    assert after["kv"]["blocks_free"] == after["kv"]["blocks_total"]
    assert after["requests"]["finished_total"] == before["requests"]["finished_total"] + n
    assert (
        after["requests"]["generation_tokens_total"]
        == before["requests"]["generation_tokens_total"] + n * max_tokens
    )
    assert after["requests"]["aborted_total"] == before["requests"]["aborted_total"]
