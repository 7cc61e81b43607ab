"""Issue 22 against a real `kvpilot serve`: oversized and malformed requests are refused early and
by name, the probes stay responsive meanwhile, API keys, and a drain that ends cut streams with
the error event while the stats feed stays up."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.health_watch import HealthWatch
from tests.service.conftest import DEFAULT_FLAGS, SERVED_MODEL, STRATEGY, ServerProcess

pytestmark = pytest.mark.service

MAX_BODY_BYTES = 8 * 1024 * 1024  # the default
HEALTH_BOUND_SECONDS = 2.0  # the issue asks that /health stay responsive; a liveness probe's timeout


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["X-Model-Strategy"] == STRATEGY
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_10_mb_prompt_is_413_and_health_stays_responsive(server: ServerProcess) -> None:
    body = json.dumps({"model": SERVED_MODEL, "prompt": "word " * 2_000_000}).encode()
    assert len(body) > 10_000_000
    with HealthWatch(server.base_url) as watch:
        response = httpx.post(
            server.base_url + "/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=120
        )
    error = _error(response, 413)
    assert f"the request body is {len(body)} bytes" in error["message"]
    assert f"at most {MAX_BODY_BYTES} bytes" in error["message"] and "--max-body-bytes" in error["message"]
    assert error["code"] == "request_too_large"
    assert watch.statuses and set(watch.statuses) == {200}
    assert max(watch.latencies) < HEALTH_BOUND_SECONDS, max(watch.latencies)


def test_a_chunked_body_over_the_limit_is_413_as_it_streams_in(server: ServerProcess) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "' + SERVED_MODEL.encode() + b'", "prompt": "'
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    response = httpx.post(
        server.base_url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=60
    )
    assert f"exceeds {MAX_BODY_BYTES} bytes" in _error(response, 413)["message"]


def test_a_prompt_too_long_for_any_tokenisation_is_400_before_tokenising(server: ServerProcess) -> None:
    before = server.stats()["requests"]["rejected_total"]["too_long"]
    with HealthWatch(server.base_url) as watch:
        response = httpx.post(
            server.base_url + "/v1/completions",
            json={"model": SERVED_MODEL, "prompt": "hello world " * 200_000},  # 2.4 MB, under the body limit
            timeout=120,
        )
    error = _error(response, 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "the prompt has 2400000 characters" in error["message"]
    assert "maximum context length of 256 tokens holds at most" in error["message"]
    assert server.stats()["requests"]["rejected_total"]["too_long"] == before + 1
    assert max(watch.latencies) < HEALTH_BOUND_SECONDS, max(watch.latencies)


@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_a_body_that_is_not_json_is_415_naming_content_type(server: ServerProcess, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(
        server.base_url + "/v1/completions",
        content=json.dumps({"model": SERVED_MODEL, "prompt": "x"}).encode(),
        headers=headers,
        timeout=30,
    )
    error = _error(response, 415)
    assert error["param"] == "Content-Type" and "Content-Type: application/json" in error["message"]
    assert ("no Content-Type header" if content_type is None else "'text/plain' is not supported") in error["message"]


def test_malformed_json_says_so_without_a_byte_offset_as_param(server: ServerProcess) -> None:
    response = httpx.post(
        server.base_url + "/v1/chat/completions",
        content=b'{"model": "tiny-llama", "messages": [}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    error = _error(response, 422)
    assert error["param"] is None and error["code"] == "invalid_json"
    assert "not valid JSON" in error["message"] and "at byte 37" in error["message"]


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [("max_tokens", "10", "integer"), ("max_tokens", True, "integer"), ("stream", "yes", "boolean"),
     ("stream", 1, "boolean"), ("temperature", "0.5", "number"), ("ignore_eos", "true", "boolean")],
)  # fmt: skip
def test_strict_types(server: ServerProcess, field: str, value: Any, kind: str) -> None:
    body = {"model": SERVED_MODEL, "prompt": "x", field: value}
    error = _error(httpx.post(server.base_url + "/v1/completions", json=body, timeout=30), 422)
    assert error["param"] == field and kind in error["message"], error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"function_call": "auto"}, "function_call"), ({"tool_choice": "required"}, "tool_choice")],
)  # fmt: skip
def test_tool_fields_that_cannot_apply_are_refused_by_name(server: ServerProcess, extra: dict, param: str) -> None:
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    error = _error(httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30), 400)
    assert error["param"] == param and error["code"] in ("unsupported_parameter", "invalid_value")
    plain = {**body, "response_format": {"type": "text"}}
    plain.pop("function_call", None), plain.pop("tool_choice", None)
    assert httpx.post(server.base_url + "/v1/chat/completions", json=plain, timeout=60).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [("/v1/completions", '{"model": "tiny-llama", "prompt": "ok \\ud800 no"}', "prompt"),
     ("/v1/chat/completions", '{"model": "tiny-llama", "messages": [{"role": "user", "content": "\\udfff"}]}',
      "messages.0.content"),
     ("/v1/completions", '{"model": "tiny-llama", "prompt": "x", "stop": ["a", "\\ud800"]}', "stop.1"),
     ("/v1/score", '{"model": "tiny-llama", "prompt": "a", "continuation": "b\\udc00"}', "continuation")],
)  # fmt: skip
def test_lone_surrogates_are_400_naming_the_field(server: ServerProcess, path: str, body: str, param: str) -> None:
    # Finding 5: a lone surrogate gave a 500 with the exception text.
    response = httpx.post(
        server.base_url + path, content=body.encode(), headers={"content-type": "application/json"}, timeout=30
    )
    error = _error(response, 400)
    assert error["param"] == param and error["code"] == "invalid_unicode"
    assert "lone UTF-16 surrogate" in error["message"]
    assert "Error" not in error["message"] and "surrogates not allowed" not in error["message"]


# ---- API keys ----


@pytest.fixture(scope="module")
def keyed(start_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    key_file = tmp_path_factory.mktemp("secret") / "api-key"
    key_file.write_text("s3cret-key\n")  # a mounted Secret often ends with a newline
    return start_server(*DEFAULT_FLAGS, "--api-key-file", str(key_file))


def test_api_key_guards_everything_but_the_probes(keyed: ServerProcess) -> None:
    url = keyed.base_url
    assert httpx.get(url + "/health").status_code == 200 and httpx.get(url + "/ready").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"}):
        response = httpx.get(url + "/v1/models", headers=headers)
        error = _error(response, 401)
        assert response.headers["WWW-Authenticate"] == "Bearer" and error["code"] == "invalid_api_key"
        assert "Authorization: Bearer <key>" in error["message"] and "s3cret" not in error["message"]
    assert httpx.get(url + "/openapi.json").status_code == 401
    good = {"Authorization": "Bearer s3cret-key"}
    assert httpx.get(url + "/v1/models", headers=good).status_code == 200
    body = {"model": SERVED_MODEL, "prompt": "x", "max_tokens": 2}
    assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 401
    assert httpx.post(url + "/v1/completions", json=body, headers=good, timeout=60).status_code == 200


def test_an_empty_key_file_is_refused_at_start(start_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    empty = tmp_path / "api-key"
    empty.write_text("\n")
    server = start_server("--api-key-file", str(empty), wait="none")
    assert server.proc.wait(120) == 2
    assert f"--api-key-file {empty} is empty" in server.log_tail()


# ---- drain ----


def test_a_stream_cut_at_the_shutdown_grace_ends_with_the_error_event(
    start_server: Callable[..., ServerProcess],
) -> None:
    # Finding 6: cut streams ended without the error event; the feed closed when the drain began.
    server = start_server(*DEFAULT_FLAGS, "--shutdown-grace", "1.5", "--fault-latency-ms", "100")
    body = {"model": SERVED_MODEL, "prompt": "go", "max_tokens": 200, "ignore_eos": True, "stream": True}
    events: list[str] = []
    feed_during_drain: list[int] = []
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                events.append(line)
                break
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        feed_during_drain.append(httpx.get(server.stats_url, timeout=5).status_code)
        events.extend(line for line in lines if line.startswith("data: "))
    assert feed_during_drain == [200]
    assert events[-1] != "data: [DONE]"
    last = json.loads(events[-1].removeprefix("data: "))
    assert last["error"]["code"] == "shutdown" and "--shutdown-grace" in last["error"]["message"]
    assert 1 < len(events) < 200
    assert server.proc.wait(60) == 0
