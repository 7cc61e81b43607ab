"""vLLM's request extensions: stop_token_ids is served; the ones kvpilot does not implement are
refused by name unless their value is what kvpilot does anyway; other unknown fields are ignored."""

from __future__ import annotations

import httpx
import pytest

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service


def post(server: ServerProcess, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/completions", json={"model": SERVED_MODEL, "prompt": "The", **body},
                      timeout=120)  # fmt: skip


def test_stop_token_ids_end_the_output_at_that_token(server: ServerProcess) -> None:
    body = {"max_tokens": 12, "temperature": 0, "logprobs": 0}
    tokens = post(server, body).json()["choices"][0]["logprobs"]["tokens"]

    def ids_of(text: str) -> list[int]:
        response = httpx.post(server.base_url + "/tokenize", json={"prompt": text, "add_special_tokens": False},
                              timeout=30)  # fmt: skip
        return response.json()["tokens"]

    k = next(i for i in range(3, len(tokens)) if len(ids_of(tokens[i])) == 1)  # a token whose text is one id
    stop_id = ids_of(tokens[k])[0]
    result = post(server, {**body, "stop_token_ids": [stop_id]}).json()
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["usage"]["completion_tokens"] == tokens.index(tokens[k]) + 1
    assert result["choices"][0]["logprobs"]["tokens"][-1] == tokens[k]  # kept in the output (not special)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [("include_stop_str_in_output", True, "never part of the output"), ("truncate_prompt_tokens", 8, "truncated"),
     ("skip_special_tokens", False, "only True"), ("allowed_token_ids", [1, 2], "logit_bias"),
     ("chat_template", "{{ x }}", "--chat-template"), ("stop_token_ids", [100000], "out of range")],
)  # fmt: skip
def test_unimplemented_extensions_are_400(server: ServerProcess, field: str, value: object, words: str) -> None:
    response = post(server, {"max_tokens": 2, field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and words in error["message"], error


def test_matching_values_and_unknown_fields_are_accepted(server: ServerProcess) -> None:
    body = {"max_tokens": 2, "skip_special_tokens": True, "include_stop_str_in_output": False, "priority": 0,
            "some_future_field": {"x": 1}}  # fmt: skip
    assert post(server, body).status_code == 200


def test_continue_final_message_and_template_kwargs(server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}]
    body = {"model": SERVED_MODEL, "messages": messages, "max_tokens": 3, "temperature": 0,
            "continue_final_message": True, "add_generation_prompt": False,
            "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    want = "<bos><|user|>\nq<eos>\n<|assistant|>\nThe answer is"
    count = httpx.post(server.base_url + "/tokenize", json={"prompt": want}, timeout=30).json()["count"]
    assert response.json()["usage"]["prompt_tokens"] == count
    body["add_generation_prompt"] = True
    error = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).json()["error"]
    assert error["param"] == "add_generation_prompt" and "must be false" in error["message"]
