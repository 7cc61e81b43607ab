"""Idempotency-Key: a retry gets the same completion, a concurrent retry joins the one in flight
(one generation, not two), and a key reused with another body is a 422."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.service.conftest import SERVED_MODEL, STRATEGY, ServerProcess

pytestmark = pytest.mark.service

# temperature 1 with no seed: two independent generations would almost surely differ.
BODY = {
    "model": SERVED_MODEL,
    "prompt": "Idempotent retries",
    "max_tokens": 24,
    "temperature": 1.0,
    "ignore_eos": True,
}


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def _finished(server: ServerProcess) -> int:
    return server.stats()["requests"]["finished_total"]


def test_same_key_same_body_returns_the_same_completion(server: ServerProcess) -> None:
    headers = _key()
    before = _finished(server)
    first = httpx.post(server.base_url + "/v1/completions", json=BODY, headers=headers, timeout=60)
    second = httpx.post(server.base_url + "/v1/completions", json=BODY, headers=headers, timeout=60)
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.json() == second.json()
    assert second.headers["X-Model-Strategy"] == STRATEGY
    assert _finished(server) == before + 1, "the retry generated again instead of replaying"
    third = httpx.post(server.base_url + "/v1/completions", json=BODY, headers=_key(), timeout=60)
    assert third.json()["id"] != first.json()["id"]


def test_same_key_different_body_is_422(server: ServerProcess) -> None:
    headers = _key()
    first = httpx.post(server.base_url + "/v1/completions", json=BODY, headers=headers, timeout=60)
    assert first.status_code == 200
    other = httpx.post(server.base_url + "/v1/completions", json={**BODY, "max_tokens": 5}, headers=headers)
    assert other.status_code == 422
    error = other.json()["error"]
    assert error["param"] == "Idempotency-Key" and error["code"] == "idempotency_key_reused"
    assert "different request body" in error["message"] and headers["Idempotency-Key"] in error["message"]
    # the same key on the other endpoint is another body too
    chat = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "x"}]}
    assert httpx.post(server.base_url + "/v1/chat/completions", json=chat, headers=headers).status_code == 422


async def test_concurrent_same_key_runs_one_generation(server: ServerProcess) -> None:
    headers = _key()
    before = server.stats()["requests"]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        responses = await asyncio.gather(
            *(
                client.post("/v1/completions", json={**BODY, "max_tokens": 64}, headers=headers)
                for _ in range(4)
            )
        )
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    bodies = [r.json() for r in responses]
    assert all(b == bodies[0] for b in bodies)
    after = server.stats()["requests"]
    assert after["finished_total"] == before["finished_total"] + 1
    assert after["generation_tokens_total"] == before["generation_tokens_total"] + 64


async def test_streaming_retry_replays_identical_chunks(server: ServerProcess) -> None:
    headers = _key()
    body = {**BODY, "stream": True}

    async def read(client: httpx.AsyncClient) -> list[str]:
        async with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            return [line async for line in response.aiter_lines() if line]

    before = _finished(server)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        joined = await asyncio.gather(read(client), read(client))
        replay = await read(client)
    assert joined[0] == joined[1] == replay
    assert replay[-1] == "data: [DONE]"
    assert _finished(server) == before + 1


def test_bad_key_is_400(server: ServerProcess) -> None:
    response = httpx.post(
        server.base_url + "/v1/completions", json=BODY, headers={"Idempotency-Key": "k" * 300}
    )
    assert response.status_code == 400
    assert "Idempotency-Key must be 1-255 printable characters" in response.json()["error"]["message"]
