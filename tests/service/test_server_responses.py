"""POST /v1/responses (a minimal subset of OpenAI's Responses API) against a real `kvpilot serve`:
it equals the chat completion it is translated into, streams the Responses events in order,
carries structured output and tool calls, and refuses what needs stored state."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}}, "required": ["ok", "n"]}  # fmt: skip


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json={"model": SERVED_MODEL, **body}, timeout=120)


def test_a_response_equals_its_chat_completion(server: ServerProcess) -> None:
    body = {"instructions": "Be brief.", "input": "Hello there", "max_output_tokens": 6, "temperature": 1.0, "seed": 4}
    response = post(server, "/v1/responses", body)
    assert response.status_code == 200, response.text
    result = response.json()
    chat = post(server, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        "max_completion_tokens": 6, "temperature": 1.0, "seed": 4}).json()  # fmt: skip
    assert result["object"] == "response" and result["id"].startswith("resp_") and result["store"] is False
    (item,) = result["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"][0]["type"] == "output_text"
    assert item["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert result["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert result["usage"]["output_tokens"] == chat["usage"]["completion_tokens"] == 6
    assert result["status"] == "incomplete" and result["incomplete_details"] == {"reason": "max_output_tokens"}


def test_streamed_events_come_in_order_and_add_up(server: ServerProcess) -> None:
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}], "max_output_tokens": 8,
            "temperature": 1.0, "seed": 2, "stream": True, "metadata": {"k": "v"}}  # fmt: skip
    events = []
    with httpx.stream("POST", server.base_url + "/v1/responses", json={"model": SERVED_MODEL, **body},
                      timeout=120) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == kind
                events.append(data)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == text == events[-4]["text"]
    assert final["usage"]["output_tokens"] == 8 and final["metadata"] == {"k": "v"}
    whole = post(server, "/v1/responses", {**body, "stream": False}).json()
    assert whole["output"][0]["content"][0]["text"] == text


def test_structured_output_and_tool_calls(server: ServerProcess) -> None:
    fmt = {"type": "json_schema", "name": "r", "schema": SCHEMA, "strict": True}
    result = post(server, "/v1/responses", {"input": "JSON please", "text": {"format": fmt}, "max_output_tokens": 60,
                                            "temperature": 1.0, "seed": 1}).json()  # fmt: skip
    assert result["status"] == "completed", result
    jsonschema.validate(json.loads(result["output"][0]["content"][0]["text"]), SCHEMA)
    tool = {"type": "function", "name": "lookup", "parameters": SCHEMA}
    result = post(server, "/v1/responses", {"input": "call it", "tools": [tool], "max_output_tokens": 60, "seed": 3,
                                            "tool_choice": {"type": "function", "name": "lookup"}}).json()  # fmt: skip
    (call,) = result["output"]
    assert call["type"] == "function_call" and call["name"] == "lookup" and call["call_id"].startswith("call_")
    jsonschema.validate(json.loads(call["arguments"]), SCHEMA)
    follow_up = [{"role": "user", "content": "call it"},
                 {"type": "function_call", "call_id": call["call_id"], "name": "lookup", "arguments": call["arguments"]},
                 {"type": "function_call_output", "call_id": call["call_id"], "output": "{\"found\": 1}"}]  # fmt: skip
    answer = post(server, "/v1/responses", {"input": follow_up, "tools": [tool], "tool_choice": "none",
                                            "max_output_tokens": 3, "seed": 3})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert [item["type"] for item in answer.json()["output"]] == ["message"], answer.text


def test_the_openai_client_reads_a_response(server: ServerProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    result = client.responses.create(model=SERVED_MODEL, input="Hello", max_output_tokens=5, store=False,
                                     extra_body={"ignore_eos": True})  # a sampled EOS would end it "completed"
    assert result.status == "incomplete" and isinstance(result.output_text, str) and result.usage.output_tokens == 5
    fmt = {"format": {"type": "json_schema", "name": "r", "schema": SCHEMA}}  # ends by itself: "completed"
    with client.responses.stream(model=SERVED_MODEL, input="Hello", max_output_tokens=60, store=False,
                                 text=fmt) as stream:  # fmt: skip
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and "".join(deltas) == final.output_text
    jsonschema.validate(json.loads(final.output_text), SCHEMA)


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [({"store": True}, "store", "not stored"), ({"previous_response_id": "resp_x"}, "previous_response_id", "input"),
     ({"background": True}, "background", "storage"), ({"include": ["x"]}, "include", "include=[]"),
     ({"reasoning": {"effort": "low"}}, "reasoning", "reasoning"), ({"truncation": "auto"}, "truncation", "disabled"),
     ({"max_output_tokens": 100000}, "max_output_tokens", "maximum context length"),
     ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}}, "text.format",
      "xgrammar cannot compile"),
     ({"ignore_eos": "yes"}, "ignore_eos", "boolean"), ({"bad_words": ["x"]}, "bad_words", "logit_bias"),
     ({"top_k": -5}, "top_k", "greater than or equal")],
)  # fmt: skip
def test_what_needs_storage_or_cannot_be_served_is_400(server: ServerProcess, extra: dict, param: str,
                                                       words: str) -> None:  # fmt: skip
    response = post(server, "/v1/responses", {"input": "x", **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_vllm_sampling_extensions_act_as_in_chat(server: ServerProcess) -> None:
    """guidellm sends ignore_eos and stop to /v1/responses for exact output lengths: they reach the
    chat completion that serves the response, as vLLM's Responses endpoint takes them."""
    body = {"input": "Hello", "max_output_tokens": 12, "temperature": 0.0, "ignore_eos": True, "min_tokens": 12}
    result = post(server, "/v1/responses", body).json()
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}],
                                                  "max_completion_tokens": 12, "temperature": 0.0, "ignore_eos": True,
                                                  "min_tokens": 12}).json()  # fmt: skip
    assert result["usage"]["output_tokens"] == 12 == chat["usage"]["completion_tokens"]
    assert result["output"][0]["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    text = chat["choices"][0]["message"]["content"]
    stop = next((text[i : i + 2] for i in range(1, len(text) - 1) if text[i : i + 2].strip()), None)
    if stop is not None:  # a stop string taken from the known output ends the response before it
        body["stop"] = [stop]
        stopped = post(server, "/v1/responses", body).json()
        assert stopped["output"][0]["content"][0]["text"] == text[: text.index(stop)]
