"""Admission control and error answers: each case's status code, OpenAI error shape and message."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.service.conftest import SERVED_MODEL, STRATEGY, ServerProcess

pytestmark = pytest.mark.service


def _post(server: ServerProcess, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=60, **kwargs)


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["X-Model-Strategy"] == STRATEGY
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def _rejected(server: ServerProcess) -> dict[str, int]:
    return server.stats()["requests"]["rejected_total"]


def test_prompt_plus_max_tokens_over_the_limit_is_400_with_both_numbers(server: ServerProcess) -> None:
    before = _rejected(server)["too_long"]
    response = _post(
        server, "/v1/completions", {"model": SERVED_MODEL, "prompt": "hello there", "max_tokens": 256}
    )
    error = _error(response, 400)
    prompt_tokens = int(error["message"].split("the prompt has ")[1].split()[0])
    assert prompt_tokens > 0
    assert "max_tokens asks for 256" in error["message"]
    assert f"{prompt_tokens + 256} tokens exceed" in error["message"]
    assert "maximum context length of 256 tokens" in error["message"]
    assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"
    assert _rejected(server)["too_long"] == before + 1


def test_prompt_alone_over_the_limit_is_400(server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "word " * 400}]
    error = _error(_post(server, "/v1/chat/completions", {"model": SERVED_MODEL, "messages": messages}), 400)
    assert "maximum context length of 256 tokens" in error["message"]
    assert "leaves no room" in error["message"]


@pytest.mark.parametrize(
    ("body", "field", "hint"),
    [
        ({"model": SERVED_MODEL}, "prompt", "Field required"),
        ({"model": SERVED_MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
        (
            {"model": SERVED_MODEL, "prompt": "x", "temperature": 3.5},
            "temperature",
            "less than or equal to 2",
        ),
        ({"model": SERVED_MODEL, "prompt": "x", "top_p": 0}, "top_p", "greater than 0"),
        ({"model": SERVED_MODEL, "prompt": "x", "stream": "sometimes"}, "stream", "boolean"),
        ({"prompt": "x"}, "model", "Field required"),
    ],
)
def test_malformed_completion_body_is_422_naming_the_field(
    server: ServerProcess, body: dict, field: str, hint: str
) -> None:
    error = _error(_post(server, "/v1/completions", body), 422)
    assert error["param"] == field
    assert field in error["message"] and hint in error["message"], error["message"]


def test_malformed_chat_messages_is_422_naming_the_field(server: ServerProcess) -> None:
    body = {"model": SERVED_MODEL, "messages": [{"role": "wizard", "content": "hi"}]}
    error = _error(_post(server, "/v1/chat/completions", body), 422)
    assert error["param"] == "messages.0.role"
    assert "messages.0.role" in error["message"] and "'user'" in error["message"]
    error = _error(_post(server, "/v1/chat/completions", {"model": SERVED_MODEL, "messages": []}), 422)
    assert error["param"] == "messages"


def test_invalid_json_is_422(server: ServerProcess) -> None:
    response = httpx.post(
        server.base_url + "/v1/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert "not valid JSON" in _error(response, 422)["message"]


@pytest.mark.parametrize(
    ("path", "extra", "param", "text"),
    [
        ("/v1/completions", {"n": 2, "echo": True}, "n", "n=2 with echo=true is not supported"),
        ("/v1/completions", {"n": 100, "prompt": ["a", "b", "c"]}, "n", "300 sequences; at most 256"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "needs logprobs=true"),
        ("/v1/completions", {"max_tokens": 0}, "max_tokens", "only allowed with echo=true"),
        ("/v1/completions", {"logit_bias": {"x": 1}}, "logit_bias", "not a token id"),
        ("/v1/completions", {"guided_json": {"type": "string", "minLength": "x"}}, "guided_json", "cannot compile"),
        ("/v1/completions", {"min_p": 0.1}, "min_p", "min_p=0.1 is not supported"),
        ("/v1/chat/completions", {"chat_template_kwargs": {"messages": 1}}, "chat_template_kwargs", "cannot set"),
        ("/v1/chat/completions", {"continue_final_message": True}, "continue_final_message", "must be the assistant"),
        ("/v1/chat/completions", {"response_format": {"type": "structural_tag"}}, "response_format", "not supported"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions", "not supported"),
        ("/v1/completions", {"logit_bias": {"99999": 1}}, "logit_bias", "out of range"),
    ],
)
def test_unsupported_options_are_400(
    server: ServerProcess, path: str, extra: dict, param: str, text: str
) -> None:
    base = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    error = _error(_post(server, path, {"model": SERVED_MODEL, **base, **extra}), 400)
    assert error["param"] == param and text in error["message"], error


def test_too_many_prompts_in_one_request_are_400(server: ServerProcess) -> None:
    error = _error(_post(server, "/v1/completions", {"model": SERVED_MODEL, "prompt": ["a"] * 257}), 400)
    assert "holds 257 prompts; at most 256" in error["message"]


def test_out_of_vocabulary_token_id_is_400(server: ServerProcess) -> None:
    error = _error(_post(server, "/v1/completions", {"model": SERVED_MODEL, "prompt": [1, 99999]}), 400)
    assert "99999" in error["message"] and "vocabulary" in error["message"]


def test_unknown_model_is_404_naming_the_served_one(server: ServerProcess) -> None:
    error = _error(_post(server, "/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404)
    assert "'gpt-9'" in error["message"] and SERVED_MODEL in error["message"]
    assert error["code"] == "model_not_found"


def test_unknown_route_and_wrong_method_use_the_error_shape(server: ServerProcess) -> None:
    assert "no route" in _error(httpx.get(server.base_url + "/v2/nothing"), 404)["message"]
    assert "not allowed" in _error(httpx.get(server.base_url + "/v1/completions"), 405)["message"]
