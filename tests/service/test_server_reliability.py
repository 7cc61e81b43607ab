"""Issue 33 against a real `kvpilot serve`: one request must not freeze, exhaust or silently kill
the server. One server for the module, with limits small enough to reach in a test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.helpers.health_watch import HealthWatch
from tests.service.conftest import DEFAULT_FLAGS, SERVED_MODEL, STRATEGY, ServerProcess

pytestmark = pytest.mark.service

COMPILE_TIMEOUT = 0.5
BODY_TIMEOUT = 2.0
HEADER_TIMEOUT = 1.0
MAX_CONNECTIONS = 16
MAX_BODY_BYTES = 8 * 1024 * 1024
HEALTH_BOUND_SECONDS = 2.0  # a liveness probe's timeout; the 100 ms figures are in bench/ (timing on a shared CI box)


@pytest.fixture(scope="module")
def server(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    return start_server(
        *DEFAULT_FLAGS, "--grammar-compile-timeout", str(COMPILE_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
        "--header-timeout", str(HEADER_TIMEOUT), "--max-connections", str(MAX_CONNECTIONS),
    )  # fmt: skip


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["X-Model-Strategy"] == STRATEGY
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def _post(server: ServerProcess, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=kw.pop("timeout", 120), **kw)


def _nested_arrays(depth: int) -> str:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return json.dumps(schema)


def test_a_slow_grammar_is_400_at_its_time_limit_and_plain_completions_do_not_wait(server: ServerProcess) -> None:
    # Item 4: a 7 KB schema of 250 nested arrays compiles for seconds; it shared the tokeniser's pool.
    warm = {"model": SERVED_MODEL, "prompt": "x", "max_tokens": 2, "guided_regex": "[a-z]+"}
    assert _post(server, "/v1/completions", warm).status_code == 200  # loads xgrammar (seconds, not timed)
    plain: list[float] = []

    def plain_completion() -> None:
        time.sleep(0.1)
        start = time.monotonic()
        assert _post(server, "/v1/completions", {"model": SERVED_MODEL, "prompt": "hi", "max_tokens": 2}).status_code == 200
        plain.append(time.monotonic() - start)

    threads = [threading.Thread(target=plain_completion)]
    with HealthWatch(server.base_url) as watch:
        for thread in threads:
            thread.start()
        bombs = [{"model": SERVED_MODEL, "prompt": "x", "max_tokens": 2, "guided_json": _nested_arrays(250 + i)}
                 for i in range(2)]  # fmt: skip
        responses: list[httpx.Response] = []
        senders = [threading.Thread(target=lambda b=b: responses.append(_post(server, "/v1/completions", b)))
                   for b in bombs]  # fmt: skip
        for sender in senders:
            sender.start()
        for sender in senders + threads:
            sender.join(120)
    for response in responses:
        error = _error(response, 400)
        assert error["param"] == "guided_json" and error["code"] == "grammar_too_complex"
        assert f"longer than {COMPILE_TIMEOUT:g} s" in error["message"] and "--grammar-compile-timeout" in error["message"]
    assert plain and plain[0] < 5.0, plain  # before: it queued behind the compiles on the 2-thread pool
    assert set(watch.statuses) == {200} and watch.worst < HEALTH_BOUND_SECONDS, watch.worst


def test_stop_strings_are_capped_by_count_and_length_and_128_still_stop(server: ServerProcess) -> None:
    # Item 2: 800k stop strings (7.6 MB) held the event loop 100 s; now at most 128, 4096 characters.
    base = {"model": SERVED_MODEL, "prompt": "count", "max_tokens": 8, "temperature": 0.0}
    error = _error(_post(server, "/v1/completions", {**base, "stop": [f"s{i}" for i in range(129)]}), 400)
    assert error["param"] == "stop" and error["code"] == "too_many_items" and "at most 128" in error["message"]
    error = _error(_post(server, "/v1/completions", {**base, "stop": ["x" * 3000, "y" * 1100]}), 400)
    assert error["param"] == "stop" and "4100 characters" in error["message"] and "at most 4096" in error["message"]
    error = _error(_post(server, "/v1/completions", {**base, "stop_token_ids": [1] * 1025}), 400)
    assert error["param"] == "stop_token_ids" and "at most 1024" in error["message"]
    free = _post(server, "/v1/completions", base).json()["choices"][0]["text"]
    assert len(free) >= 2, free
    stops = [f"never-{i}" for i in range(127)] + [free[1:3]]  # the greedy text's 2nd-3rd characters
    stopped = _post(server, "/v1/completions", {**base, "stop": stops}).json()["choices"][0]
    assert stopped["text"] == free[: free.index(free[1:3])] and stopped["finish_reason"] == "stop", (free, stopped)


def _raw(server: ServerProcess, head: bytes, body: bytes = b"", *, pause_s: float = 0.0,
         timeout: float = 60) -> bytes:  # fmt: skip
    """Send raw bytes on one connection (headers, then the body after `pause_s`); the answer's bytes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(head)
        if pause_s:
            time.sleep(pause_s)
        with contextlib.suppress(OSError):  # the server answered and closed while the body was going out
            sock.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < answer.find(b"\r\n\r\n") + 4 + _length(answer):
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
        return answer


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def _raw_json(answer: bytes) -> tuple[int, dict[str, Any]]:
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.split(b"\r\n\r\n", 1)[1])


def test_the_body_limit_counts_the_bytes_read_whatever_content_length_says(server: ServerProcess) -> None:
    # Item 3: Content-Length: 10 with Transfer-Encoding: chunked got 9 MB bodies accepted.
    payload = b'{"model": "tiny-llama", "prompt": "' + b"x" * (9 * 1024 * 1024) + b'", "max_tokens": 1}'
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in
                       (payload[i : i + 65536] for i in range(0, len(payload), 65536))) + b"0\r\n\r\n"  # fmt: skip
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    with HealthWatch(server.base_url) as watch:
        status, body = _raw_json(_raw(server, head, chunked))
    assert status == 413, body
    assert body["error"]["code"] == "request_too_large" and f"exceeds {MAX_BODY_BYTES} bytes" in body["error"]["message"]
    assert set(watch.statuses) == {200} and watch.worst < HEALTH_BOUND_SECONDS, watch.worst


def test_bodies_of_many_items_or_deep_nesting_are_refused_as_they_arrive(server: ServerProcess) -> None:
    # Item 6: 200k small messages stalled /health 4.45 s while they were parsed and validated.
    many = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": ""}] * 200_000}
    with HealthWatch(server.base_url) as watch:
        error = _error(_post(server, "/v1/chat/completions", many), 400)
    assert error["code"] == "request_too_complex" and "more than 10000 objects" in error["message"]
    assert set(watch.statuses) == {200} and watch.worst < HEALTH_BOUND_SECONDS, watch.worst
    ids = {"model": SERVED_MODEL, "prompt": [[5, 6]] * 70_000, "max_tokens": 1}  # 210k values
    assert "more than 200000 values" in _error(_post(server, "/v1/completions", ids), 400)["message"]
    deep: Any = "x"
    for _ in range(100):
        deep = [deep]
    error = _error(_post(server, "/v1/completions", {"model": SERVED_MODEL, "prompt": "x", "guided_json": deep}), 400)
    assert "nests 101 levels deep; at most 64" in error["message"]
    # empty messages passed the length pre-check: their number is capped too
    empty = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": ""}] * 5000, "max_tokens": 1}
    error = _error(_post(server, "/v1/chat/completions", empty), 400)
    assert error["param"] == "messages" and "5000 messages; at most 4096" in error["message"]


def test_an_oversize_constraint_is_refused_from_the_raw_bytes_before_the_body_is_parsed(server: ServerProcess) -> None:
    # Item 1's open case: sixteen 50,000-value enums took /health past a second, each body parsed,
    # validated and serialised for its cache key before the refusal. A malformed max_tokens shows
    # which came first: a parsed and validated body is a 422 naming max_tokens.
    enum = {"enum": [f"v-{i}" for i in range(50_000)]}
    before = server.stats()["requests"]["rejected_total"]["invalid"]
    cases = [
        ("/v1/completions", {"prompt": "hi", "guided_json": enum}, "guided_json"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
         "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": enum}}}, "response_format"),
        ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": enum}}},
         "text.format"),
    ]  # fmt: skip
    for path, fields, param in cases:
        body = {"model": SERVED_MODEL, "max_tokens": "lots", "max_output_tokens": "lots", **fields}
        error = _error(_post(server, path, body), 400)
        assert error["param"] == param and error["code"] == "invalid_value", error
        assert error["message"].startswith(f"{param} holds at least ") and "at most 131072 characters" in error["message"]
    assert server.stats()["requests"]["rejected_total"]["invalid"] == before + len(cases)
    # over the limit only in its whitespace: not refused from the raw bytes (parsed: the 422 names max_tokens)
    small = json.dumps({"model": SERVED_MODEL, "prompt": "hi", "max_tokens": "lots",
                        "guided_json": {"enum": [f"v-{i}" for i in range(9000)]}}, indent=8)  # fmt: skip
    assert len(small) > 131072
    response = httpx.post(server.base_url + "/v1/completions", content=small, headers={"content-type": "application/json"})
    assert _error(response, 422)["param"] == "max_tokens"


def test_a_body_that_trickles_in_is_408_at_the_body_timeout(server: ServerProcess) -> None:
    # Item 8 (the body's part): half-sent bodies held their connection for as long as the client liked.
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"model\": ")  # fmt: skip
    started = time.monotonic()
    status, body = _raw_json(_raw(server, head, b"", timeout=30))
    assert status == 408 and body["error"]["code"] == "request_timeout", body
    assert f"within {BODY_TIMEOUT:g} s (--body-timeout)" in body["error"]["message"]
    assert time.monotonic() - started < BODY_TIMEOUT + 10


def test_a_connection_that_never_finishes_its_headers_is_408_at_the_header_timeout(server: ServerProcess) -> None:
    # Item 8: 200 idle or half-sent connections were held 60 s (no header timeout in uvicorn).
    started = time.monotonic()
    answer = _raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", timeout=30)
    status, body = _raw_json(answer)
    assert status == 408 and body["error"]["code"] == "request_timeout", answer
    assert f"within {HEADER_TIMEOUT:g} s (--header-timeout)" in body["error"]["message"]
    assert time.monotonic() - started < HEADER_TIMEOUT + 10
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as silent:
        assert silent.recv(100) == b""  # nothing of a request arrived: closed quietly, as keep-alive closes


def test_idle_connections_at_the_cap_make_room_for_new_ones(server: ServerProcess) -> None:
    # Item 8: a flood of idle sockets (with a low open-files limit, the accept loop failed) locked out /health.
    socks = []
    with HealthWatch(server.base_url) as watch:
        for _ in range(3 * MAX_CONNECTIONS):
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            socks[-1].sendall(b"GET /he")  # half a request line: closed with an answer that says why
            time.sleep(0.01)
        time.sleep(0.3)
        health = httpx.get(server.base_url + "/health", timeout=10)
    closed = []
    for sock in socks:
        sock.settimeout(0.3)
        try:
            closed.append(b"idle connection closed" in sock.recv(4096))  # not the header timeout's 408
        except TimeoutError:
            closed.append(False)
        sock.close()
    assert health.status_code == 200
    assert sum(closed) >= 2 * MAX_CONNECTIONS - 2, sum(closed)  # the oldest went first, with a 503 saying why
    assert closed[0] and not closed[-1]
    assert set(watch.statuses) == {200}, watch.statuses


def test_past_a_low_open_files_limit_health_answers_the_log_stays_small_and_the_server_recovers(
    start_server: Callable[..., ServerProcess],
) -> None:
    # Item 8: with a low open-files limit the accept loop failed, /health timed out, and 53k
    # tracebacks (24 MB) filled the log; asyncio retried each failed accept with a traceback of its own.
    limit = 64  # soft and hard: what `ulimit -n 64` or a container's limit gives the process
    low = start_server(*DEFAULT_FLAGS, nofile=limit)
    socks: list[socket.socket] = []
    try:
        # the server closes idle connections here, a keep-alive probe's too: probe as the kubelet does (a new
        # connection each time), which must wait in the accept queue behind the flood and still be answered
        with HealthWatch(low.base_url, keep_alive=False) as watch:
            for i in range(200):  # far past the limit: the kernel queues them, the server must shed some
                socks.append(socket.create_connection(("127.0.0.1", low.port), timeout=30))
                if i % 2:
                    socks[-1].sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len")
            time.sleep(1.5)
            assert len(os.listdir(f"/proc/{low.proc.pid}/fd")) <= limit
    finally:
        for sock in socks:
            sock.close()
    assert watch.statuses and set(watch.statuses) == {200}, watch.statuses
    assert watch.worst < HEALTH_BOUND_SECONDS, watch.worst  # an accept retry waits 1 s (asyncio's delay)
    plain = {"model": SERVED_MODEL, "prompt": "hi", "max_tokens": 2}
    assert _post(low, "/v1/completions", plain).status_code == 200  # recovered once the connections closed
    assert low.terminate() == 0
    log = low.log_path.read_text(errors="replace")
    assert "accepts failed at the open-files limit" in log, log[-2000:]
    assert log.count("Traceback") <= 10 and len(log) < 20_000, (log.count("Traceback"), len(log), log[-3000:])


_CHAT = '{"model": "tiny-llama", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "max_tokens": 1, "logit_bias": {"\u00b2": 1}}',
      "logit_bias", None),
     ("/v1/chat/completions", _CHAT + ', "user": "\\ud800"}', "user", "invalid_unicode"),
     ("/v1/chat/completions", _CHAT + ', "chat_template_kwargs": {"x": "\\udc00"}}', "chat_template_kwargs.x",
      "invalid_unicode"),
     ("/v1/chat/completions", _CHAT + ', "tools": [{"type": "function", "function": {"name": "f", "description": '
      '"\\ud800"}}]}', "tools.0.function.description", "invalid_unicode"),
     ("/v1/chat/completions", '{"model": "tiny-llama", "max_tokens": 1, "messages": [{"role": "assistant", '
      '"content": null, "tool_calls": [{"id": "\\ud800", "type": "function", "function": {"name": "f", '
      '"arguments": "{}"}}]}, {"role": "user", "content": "hi"}]}', "messages.0.tool_calls.0.id", "invalid_unicode"),
     ("/v1/chat/completions", '{"model": "tiny-llama", "max_tokens": 1, "messages": [{"role": "assistant", '
      '"content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", '
      '"arguments": "{\\"a\\": \\"\\\\ud800\\"}"}}]}, {"role": "user", "content": "hi"}]}',
      "messages.0.tool_calls.0.function.arguments.a", "invalid_unicode"),
     ("/tokenize", '{"prompt": "a\\ud800"}', "prompt", "invalid_unicode")],
)  # fmt: skip
def test_inputs_that_gave_500_are_400_naming_the_field(
    server: ServerProcess, path: str, body: str, param: str, code: str | None
) -> None:
    # Item 12: each of these was a 500 (or, for lone surrogates outside the checked fields, accepted).
    response = httpx.post(server.base_url + path, content=body.encode(), headers={"content-type": "application/json"},
                          timeout=60)  # fmt: skip
    error = _error(response, 400)
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code and "lone UTF-16 surrogate" in error["message"]


def test_tool_call_arguments_nested_100k_deep_are_400(server: ServerProcess) -> None:
    arguments = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    body = {"model": SERVED_MODEL, "max_tokens": 1, "messages": [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "user", "content": "hi"}]}  # fmt: skip
    error = _error(_post(server, "/v1/chat/completions", body), 400)
    assert error["param"] == "messages.0.tool_calls.0.function.arguments" and "deeper" in error["message"]


def test_sigterm_during_a_grammar_compile_answers_json_503_and_exits_within_the_grace(
    start_server: Callable[..., ServerProcess],
) -> None:
    # Item 11: the caller got a plain-text 500 and the exit took 33 s with --shutdown-grace 5.
    server = start_server(*DEFAULT_FLAGS, "--shutdown-grace", "2", "--grammar-compile-timeout", "600")
    warm = {"model": SERVED_MODEL, "prompt": "x", "max_tokens": 2, "guided_regex": "[a-z]+"}
    assert _post(server, "/v1/completions", warm).status_code == 200
    answers: list[httpx.Response] = []
    bomb = {"model": SERVED_MODEL, "prompt": "x", "max_tokens": 2, "guided_json": _nested_arrays(500)}  # ~40 s idle
    sender = threading.Thread(target=lambda: answers.append(_post(server, "/v1/completions", bomb)))
    sender.start()
    server.wait_stats(lambda feed: feed["grammar"]["running"] == 1, timeout=60)  # the compile is running
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    sender.join(60)
    assert server.proc.wait(60) == 0
    assert time.monotonic() - started < 2 + 25, "the exit waited for the compile"  # slack for a loaded CI box
    error = _error(answers[0], 503)
    assert error["code"] == "shutdown" and "shutting down" in error["message"]


def test_huge_tool_schemas_are_refused_before_the_template_renders_them(server: ServerProcess) -> None:
    # Issue 31's attacker: tool definitions are rendered into the prompt whole (the template holds the GIL).
    tool = {"type": "function", "function": {"name": "f", "description": "d" * 600_000, "parameters": {"type": "object"}}}
    body = {"model": SERVED_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    error = _error(_post(server, "/v1/chat/completions", body), 400)
    assert error["param"] == "tools" and error["code"] == "too_many_items" and "at most 524288" in error["message"]
