"""`kvpilot serve --engine-core process`: the engine steps in a child process; the API process serves.

The same completions as the one-process server, streamed and whole; scores and the stats feed go to
the core and back; a client that goes away frees its blocks; a core that dies fails the requests in
flight and turns /health red (as a dead engine thread does)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import DEFAULT_FLAGS, SERVED_MODEL

pytestmark = pytest.mark.service


def _core_pid(server_pid: int) -> int:
    """The engine core: the server's child started by multiprocessing's spawn."""
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
                return int(child)
    raise AssertionError("no engine core process under the server")


def _complete(base_url: str, **body) -> dict:
    body = {"model": SERVED_MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "temperature": 0.0, **body}
    response = httpx.post(base_url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _stream_text(base_url: str, **body) -> tuple[str, list[str]]:
    body = {"model": SERVED_MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "temperature": 0.0, "stream": True,
            **body}  # fmt: skip
    events = []
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                events.append(json.loads(line[5:]))
    text = "".join(c.get("text", "") for e in events for c in e.get("choices", []))
    return text, [c.get("finish_reason") for e in events for c in e.get("choices", []) if c.get("finish_reason")]


@pytest.fixture(scope="module")
def core_server(start_server):
    return start_server(*DEFAULT_FLAGS, "--engine-core", "process")


def test_core_process_serves_what_the_thread_engine_serves(core_server, server) -> None:
    for prompt in ([5, 6, 7, 8, 9], "hello there", [3] * 40):
        core, thread = _complete(core_server.base_url, prompt=prompt), _complete(server.base_url, prompt=prompt)
        assert core["choices"] == thread["choices"] and core["usage"] == thread["usage"]
    assert _stream_text(core_server.base_url) == _stream_text(server.base_url)
    whole = _complete(core_server.base_url, max_tokens=12)["choices"][0]["text"]
    assert _stream_text(core_server.base_url)[0] == whole
    bad = httpx.post(core_server.base_url + "/v1/completions", timeout=30,
                     json={"model": SERVED_MODEL, "prompt": [10**6], "max_tokens": 2})  # fmt: skip
    assert bad.status_code == 400 and "out of range" in bad.text


def test_scores_stats_and_a_vanished_client(core_server, server) -> None:
    body = {"model": SERVED_MODEL, "prompt": "the quick", "continuation": " brown fox"}
    scores = [httpx.post(s.base_url + "/v1/score", json=body, timeout=60) for s in (core_server, server)]
    if scores[0].status_code != 404:  # --no-score-route servers answer 404 on both
        assert scores[0].status_code == 200, scores[0].text
        assert scores[0].json()["token_logprobs"] == pytest.approx(scores[1].json()["token_logprobs"], abs=1e-5)
    body = {"model": SERVED_MODEL, "prompt": [5, 6, 7], "max_tokens": 200, "temperature": 0.0, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", core_server.base_url + "/v1/completions", json=body, timeout=60) as response:
        for _ in response.iter_lines():
            break  # gone after the first event: the request is aborted, its blocks freed
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        feed = core_server.stats()
        if feed["kv"]["blocks_used"] == 0 and not feed["requests"].get("running"):
            break
        time.sleep(0.1)
    assert feed["kv"]["blocks_used"] == 0, feed["kv"]
    assert feed["engine"]["model"] == SERVED_MODEL


def test_a_dead_core_fails_requests_and_turns_health_red(start_server) -> None:
    server = start_server(*DEFAULT_FLAGS, "--engine-core", "process")
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    body = {"model": SERVED_MODEL, "prompt": [5, 6, 7], "max_tokens": 240, "temperature": 0.0, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # the stream is running
        os.kill(_core_pid(server.proc.pid), signal.SIGKILL)
        rest = list(lines)
    assert any('"error"' in line for line in rest), rest[-3:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and httpx.get(server.base_url + "/health", timeout=10).status_code == 200:
        time.sleep(0.1)
    health = httpx.get(server.base_url + "/health", timeout=10)
    assert health.status_code == 503 and "engine" in health.text
    after = httpx.post(server.base_url + "/v1/completions", timeout=30,
                       json={"model": SERVED_MODEL, "prompt": [5], "max_tokens": 2})  # fmt: skip
    assert after.status_code == 503
