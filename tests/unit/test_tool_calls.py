"""Tool calling's pure parts: the model-format parsers, the streamed shaping (split at every
character), the constraint tool_choice puts on the output, and the 400s for what cannot be served."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from kvpilot.engine.server.http.errors import APIError
from kvpilot.engine.server.tools.tool_calls import ToolPlan, tool_plan
from kvpilot.engine.server.tools.tool_parsers import detect_parser, held_back, parse_tool_calls
from kvpilot.engine.server.wire.request_bodies import ChatCompletionRequest

pytestmark = pytest.mark.unit

NAMES = {"get_weather", "lookup"}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "by id"}},
]  # fmt: skip
TEMPLATE = "{% if tools %}{{ tools | tojson }}{% endif %}<tool_call>"


def calls(parsed: list) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed]


def test_hermes_calls_content_and_what_stays_text() -> None:
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n' \
           '<tool_call>{"name": "lookup", "arguments": "{\\"id\\": 3}"}</tool_call>'  # fmt: skip
    content, parsed = parse_tool_calls("hermes", text, NAMES)
    assert content == "Let me check." and calls(parsed) == [("get_weather", {"city": "Oslo"}), ("lookup", {"id": 3})]
    assert all(c.id.startswith("call_") for c in parsed) and parsed[0].id != parsed[1].id
    for plain in ("no calls here", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "<tool_call>{oops"):
        assert parse_tool_calls("hermes", plain, NAMES) == (plain, [])
    unclosed = '<tool_call>{"name": "lookup", "arguments": {}}'  # cut before the closing tag: still a call
    assert calls(parse_tool_calls("hermes", unclosed, NAMES)[1]) == [("lookup", {})]


def test_llama3_json_calls() -> None:
    text = '<|python_tag|>{"name": "lookup", "parameters": {"id": 1}}; {"name": "get_weather", "parameters": {"city": "x"}}'
    content, parsed = parse_tool_calls("llama3_json", text, NAMES)
    assert content is None and calls(parsed) == [("lookup", {"id": 1}), ("get_weather", {"city": "x"})]
    for plain in ("The answer is {x}", '{"name": "nope", "parameters": {}}', '{"name": "lookup", "parameters": 3}'):
        assert parse_tool_calls("llama3_json", plain, NAMES) == (plain, [])


def test_detect_parser_and_held_back() -> None:
    assert detect_parser("...<tool_call>...") == "hermes"
    assert detect_parser("<|python_tag|>{{ x }}") == "llama3_json"
    assert detect_parser("{{ messages }}") is None and detect_parser(None) is None
    assert held_back("abc<tool", "<tool_call>") == 5 and held_back("abc", "<tool_call>") == 0
    assert held_back("<", "<tool_call>") == 1


def streamed(plan: ToolPlan, text: str, reason: str = "stop") -> tuple[str, list[dict], str | None]:
    """Feed `text` one character at a time: (content, tool-call deltas, finish reason)."""
    stream = plan.streamer()
    parts = [p for ch in text for p in stream.feed(ch)]
    tail, final = stream.finish(reason)
    parts += tail
    content = "".join(p.get("content", "") for p in parts)
    deltas = [d for p in parts for d in p.get("tool_calls", [])]
    return content, deltas, final


def test_streamed_auto_hermes_equals_the_whole_parse() -> None:
    plan = ToolPlan("auto", TOOLS, parser="hermes")
    text = 'Hi <tool <tool_call>{"name": "lookup", "arguments": {"id": 2}}</tool_call>'
    content, deltas, reason = streamed(plan, text)
    assert content == "Hi <tool " and reason == "tool_calls"
    assert [(d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas] == [("lookup", {"id": 2})]
    whole = plan.message(text, "stop")
    assert whole[0] == "Hi <tool" and whole[2] == "tool_calls" and len(whole[1] or []) == 1
    plain = "no <tool_call here"  # a partial tag is held back, then released as content
    assert streamed(plan, plain) == (plain, [], "stop")


def test_streamed_named_arguments_and_required_array() -> None:
    named = ToolPlan("named", TOOLS, named="get_weather")
    content, deltas, reason = streamed(named, '{"city": "Rome"}')
    assert content == "" and reason == "stop" and deltas[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "Rome"}'
    assert len({d.get("id") for d in deltas if d.get("id")}) == 1
    required = ToolPlan("required", TOOLS)
    text = '[{"name": "lookup", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "a"}}]'
    content, deltas, reason = streamed(required, text)
    assert content == "" and reason == "tool_calls" and [d["index"] for d in deltas if "id" in d] == [0, 1]
    cut = '[{"name": "lookup", "argu'  # max_tokens cut the array: the call went out, finish "length" (as OpenAI)
    content, deltas, reason = streamed(required, cut, "length")
    assert content == "" and reason == "length" and deltas == [{"index": 0, "id": deltas[0]["id"], "type": "function",
                                                                  "function": {"name": "lookup", "arguments": ""}}]
    early = '[{"name": "look'  # cut before any name was complete: nothing went out, so it is content
    assert streamed(required, early, "length") == (early, [], "length")
    llama = ToolPlan("auto", TOOLS, parser="llama3_json")
    assert streamed(llama, '  {"name": "lookup", "parameters": {"id": 4}}')[2] == "tool_calls"
    assert streamed(llama, "plain words") == ("plain words", [], "stop")


def test_required_and_named_constraints_accept_exactly_the_calls() -> None:
    schema = ToolPlan("required", TOOLS).spec().value  # type: ignore[union-attr]
    jsonschema.validate([{"name": "get_weather", "arguments": {"city": "x"}}, {"name": "lookup", "arguments": {}}],
                        schema)  # fmt: skip
    for bad in ([], [{"name": "get_weather", "arguments": {}}], [{"name": "other", "arguments": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = ToolPlan("required", TOOLS, parallel=False).spec().value  # type: ignore[union-attr]
    assert single["maxItems"] == 1
    assert ToolPlan("named", TOOLS, named="get_weather").spec().value == TOOLS[0]["function"]["parameters"]  # type: ignore[union-attr]
    assert ToolPlan("auto", TOOLS, parser="hermes").spec() is None and ToolPlan("none", TOOLS).spec() is None


def request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}], **fields})


@pytest.mark.parametrize(
    ("fields", "parser", "template", "param", "words"),
    [({"tool_choice": "required"}, "hermes", TEMPLATE, "tool_choice", "needs tools"),
     ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "hermes", TEMPLATE,
      "tool_choice", "not among the tools"),
     ({"tools": TOOLS, "tool_choice": "sometimes"}, "hermes", TEMPLATE, "tool_choice", "must be 'none'"),
     ({"tools": [TOOLS[1], TOOLS[1]]}, "hermes", TEMPLATE, "tools", "unique"),
     ({"tools": TOOLS}, "hermes", "{{ messages }}", "tools", "does not render `tools`"),
     ({"tools": TOOLS, "tool_choice": "auto"}, None, TEMPLATE, "tool_choice", "--tool-call-parser")],
)  # fmt: skip
def test_tool_requests_that_cannot_be_served_are_400(fields: dict, parser: str | None, template: str, param: str,
                                                     words: str) -> None:  # fmt: skip
    with pytest.raises(APIError) as info:
        tool_plan(request(**fields), parser, template)
    assert info.value.status == 400 and info.value.param == param and words in info.value.message


def test_plans_by_tool_choice() -> None:
    assert tool_plan(request(), "hermes", TEMPLATE) is None
    assert tool_plan(request(tool_choice="none"), None, None) is None
    auto = tool_plan(request(tools=TOOLS), "hermes", TEMPLATE)
    assert auto is not None and auto.mode == "auto" and auto.names == NAMES
    named = tool_plan(request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "lookup"}},
                              parallel_tool_calls=False), None, TEMPLATE)  # fmt: skip
    assert named is not None and (named.mode, named.named, named.parallel) == ("named", "lookup", False)
    assert tool_plan(request(tools=TOOLS, tool_choice="required"), None, TEMPLATE).mode == "required"  # type: ignore[union-attr]


REQUIRED_TEXT = ('[ {"name": "get_weather", "arguments": {"city": "New {York} \\"NY\\"", "days": [1, {"a": "]"}]}},\n'
                 ' {"arguments" : {}, "name":"lookup"} ,{"name": "lookup", "arguments": {"id": 7} } ]')


@pytest.mark.parametrize("seed", range(6))
def test_required_calls_stream_as_generated_in_any_chunking(seed: int) -> None:
    """Each call opens once its name is complete; its argument pieces add up to exactly the value's
    JSON text, whatever the chunking; the result parses to what the whole-output parse returns."""
    import random

    rng = random.Random(seed)
    stream, deltas, at = ToolPlan("required", TOOLS).streamer(), [], 0
    while at < len(REQUIRED_TEXT):
        step = rng.randint(1, 9) if seed else 1
        for part in stream.feed(REQUIRED_TEXT[at : at + step]):
            deltas += part["tool_calls"]
        at += step
    tail, reason = stream.finish("stop")
    assert tail == [] and reason == "tool_calls"
    heads = [d for d in deltas if "id" in d]
    assert [(d["index"], d["function"]["name"]) for d in heads] == [(0, "get_weather"), (1, "lookup"), (2, "lookup")]
    assert len({d["id"] for d in heads}) == 3
    args = ["".join(d["function"]["arguments"] for d in deltas if d["index"] == i) for i in range(3)]
    assert args[1] == "{}" and args[2] == '{"id": 7}'
    whole = ToolPlan("required", TOOLS).message(REQUIRED_TEXT, "stop")[1]
    assert [json.loads(a) for a in args] == [json.loads(c["function"]["arguments"]) for c in whole or []]
    assert json.loads(args[0]) == {"city": 'New {York} "NY"', "days": [1, {"a": "]"}]}


def test_required_call_opens_before_its_arguments_are_complete() -> None:
    stream = ToolPlan("required", TOOLS).streamer()
    assert stream.feed('[{"name": "get_wea') == []
    first = stream.feed('ther", "arguments": {"ci')
    assert first[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"ci'}
    assert stream.feed('ty": "x"}') == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "x"}'}}]}]
    assert stream.feed("}]") == []  # the item's and the array's closing brackets are not arguments


def test_auto_hermes_sends_each_call_when_its_block_closes() -> None:
    stream = ToolPlan("auto", TOOLS, parser="hermes").streamer()
    assert stream.feed("Checking. <tool_call>") == [{"content": "Checking. "}]
    assert stream.feed('{"name": "lookup", "arguments": {"id": 1}}') == []
    first = stream.feed("</tool_call>\n<tool_call>")
    assert [(d["tool_calls"][0]["index"], d["tool_calls"][0]["function"]["name"]) for d in first] == [(0, "lookup")]
    assert stream.feed('{"name": "nope", "arguments": {}}</tool_call><tool_call>{"name": "get_weather", ') == []
    tail, reason = stream.finish("length")  # the last block was cut off: not a call, so nothing more
    assert tail == [] and reason == "length"
    single = ToolPlan("auto", TOOLS, parser="hermes", parallel=False).streamer()
    two = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call><tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
    sent = [d for part in single.feed(two) for d in part.get("tool_calls", [])] + \
        [d for part in single.finish("stop")[0] for d in part.get("tool_calls", [])]  # fmt: skip
    assert [d["index"] for d in sent] == [0]


@pytest.mark.parametrize("text", ['[{"name": "lookup", "arguments": {"id": 1', '[{"name": "lookup", "arguments": {}}, {"na',
                                  '[{"name": "get_weather", "arguments": {"city": "O'])  # fmt: skip
def test_required_cut_by_max_tokens_whole_equals_streamed(text: str) -> None:
    plan = ToolPlan("required", TOOLS)
    content, calls_, reason = plan.message(text, "length")
    _, deltas, streamed_reason = streamed(plan, text, "length")
    assert content is None and reason == streamed_reason == "length"
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in calls_ or []]
    names = {d["index"]: d["function"]["name"] for d in deltas if "id" in d}
    assert got == [(names[i], "".join(d["function"]["arguments"] for d in deltas if d["index"] == i)) for i in names]


def test_text_past_the_constraint_is_content_not_calls() -> None:
    """ignore_eos runs the output on after the constraint's end: what follows (here text that looks
    like more calls) is content, whole and streamed alike."""
    required = ToolPlan("required", TOOLS)
    text = '[{"name": "lookup", "arguments": {"id": 1}}] [{"name": "get_weather", "arguments": {}}] more'
    content, whole, reason = required.message(text, "length")
    assert content == ' [{"name": "get_weather", "arguments": {}}] more' and reason == "length"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in whole or []] == [("lookup", '{"id": 1}')]
    assert streamed(required, text, "length")[0] == content
    assert len([d for d in streamed(required, text, "length")[1] if "id" in d]) == 1
    assert required.message('[{"name": "lookup", "arguments": {}}]  \n', "length")[0] is None  # only spaces: none
    named = ToolPlan("named", TOOLS, named="get_weather")
    text = '{"city": "a}b", "x": {"y": [1]}} and on'
    content, whole, _ = named.message(text, "length")
    assert content == " and on" and (whole or [])[0]["function"]["arguments"] == '{"city": "a}b", "x": {"y": [1]}}'
    s_content, deltas, _ = streamed(named, text, "length")
    assert s_content == content and "".join(d["function"]["arguments"] for d in deltas) == text[: -len(content)]
