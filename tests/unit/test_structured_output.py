"""Structured output on a real tiny random model: without the grammar mask it emits garbage, so
every parse and validation below is the mask's doing. Batched rows, preemption, abort."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import jsonschema
import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.structured.compiler import GrammarError, ebnf_literal
from kvpilot.engine.structured.spec import StructuredSpec
from tests.helpers.json_schemas import random_schema

pytestmark = pytest.mark.unit

PROMPT = "Answer in JSON: "


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("structured") / "tiny", "llama", "tiny")


def engine_for(model_dir: Path, **config: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), device="cpu", show_progress=False, **config))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> LLMEngine:
    return engine_for(model_dir, num_kv_blocks=512)


def run(engine: LLMEngine, params: list[SamplingParams], prompt: str = PROMPT) -> list[tuple[str, str | None]]:
    """Every request at once (one batch); (text, finish reason) in order."""
    ids = engine.tokenizer.encode(prompt)
    names = [f"r{i}-{random.random()}" for i in range(len(params))]
    for name, p in zip(names, params, strict=True):
        engine.add_request(name, ids, p)
    done: dict[str, tuple[str, str | None]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = (out.text, out.finish_reason)
    assert len(engine.structured) == 0, "a grammar matcher outlived its request"
    return [done[n] for n in names]


def schema_params(schemas: list[dict], **kw: object) -> list[SamplingParams]:
    return [SamplingParams(temperature=1.0, seed=i, max_tokens=400, structured=StructuredSpec("json_schema", s), **kw)  # type: ignore[arg-type]
            for i, s in enumerate(schemas)]  # fmt: skip


def check_valid(schemas: list[dict], outs: list[tuple[str, str | None]]) -> None:
    for schema, (text, reason) in zip(schemas, outs, strict=True):
        assert reason == "stop", (reason, text, schema)
        jsonschema.validate(json.loads(text), schema)  # json.loads is strict: no raw control characters


def test_twenty_random_schemas_always_validate(engine: LLMEngine) -> None:
    rng = random.Random(17)
    schemas = [random_schema(rng) for _ in range(20)]
    outs = run(engine, schema_params(schemas))
    check_valid(schemas, outs)
    unconstrained = run(engine, [SamplingParams(temperature=1.0, seed=i, max_tokens=40) for i in range(5)])
    assert not any(_parses(text) for text, _ in unconstrained), "the random model emits JSON by itself: no test"


def test_same_schema_twice_compiles_once_and_greedy_repeats(engine: LLMEngine) -> None:
    schema = random_schema(random.Random(3))
    before = engine.structured.compiler.stats()
    params = [SamplingParams(temperature=0.0, max_tokens=400, structured=StructuredSpec("json_schema", schema))] * 3
    outs = run(engine, params)
    assert len({text for text, _ in outs}) == 1
    check_valid([schema] * 3, outs)
    after = engine.structured.compiler.stats()
    assert after["misses"] - before["misses"] <= 1 and after["hits"] > before["hits"]


def test_json_object_always_parses_to_an_object(engine: LLMEngine) -> None:
    tok = engine.tokenizer
    # nudge the random model to close strings and objects so it ends within max_tokens; the mask
    # decides where either may appear
    bias = {tok.encode(c, add_special_tokens=False)[0]: 6.0 for c in ('"', "}")}
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=300, logit_bias=bias,
                             structured=StructuredSpec("json_object")) for i in range(8)]  # fmt: skip
    for text, reason in run(engine, params):
        assert reason == "stop", text
        assert isinstance(json.loads(text), dict), text


def test_regex_and_choice(engine: LLMEngine) -> None:
    pattern = r"[0-9]{3}-[a-z]{2,4}( ok)?"
    choices = ("alpha", 'say "yes"', "é\nline", "beta gamma")
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, structured=StructuredSpec("regex", pattern))
              for i in range(4)]  # fmt: skip
    params += [SamplingParams(temperature=1.0, seed=i, max_tokens=40, structured=StructuredSpec("choice", choices))
               for i in range(6)]  # fmt: skip
    outs = run(engine, params)
    for text, reason in outs[:4]:
        assert reason == "stop" and re.fullmatch(pattern, text), text
    for text, reason in outs[4:]:
        assert reason == "stop" and text in choices, text


def test_grammar_and_mixed_batch_with_plain_rows(engine: LLMEngine) -> None:
    grammar = 'root ::= "[" item ("," item)* "]"\nitem ::= [0-9] | "x"'
    params = [SamplingParams(temperature=1.0, seed=1, max_tokens=60, structured=StructuredSpec("grammar", grammar)),
              SamplingParams(temperature=1.0, seed=2, max_tokens=8),
              SamplingParams(temperature=0.0, max_tokens=60, structured=StructuredSpec("regex", "(ab){1,3}c"))]  # fmt: skip
    (text, reason), (_, plain_reason), (text2, _) = run(engine, params)
    assert reason == "stop" and re.fullmatch(r"\[[0-9x](,[0-9x])*\]", text), text
    assert plain_reason == "length"
    assert re.fullmatch("(ab){1,3}c", text2), text2


def test_preempted_and_recomputed_rows_still_validate(model_dir: Path) -> None:
    small = engine_for(model_dir, num_kv_blocks=14, block_size=16, max_num_seqs=12)
    rng = random.Random(5)
    schemas = [random_schema(rng) for _ in range(12)]
    outs = run(small, schema_params(schemas), prompt=PROMPT * 3)
    assert small.scheduler.num_preemptions > 0, "the pool was large enough: nothing was preempted"
    check_valid(schemas, outs)


def test_abort_and_bad_grammars_leak_nothing(engine: LLMEngine) -> None:
    ids = engine.tokenizer.encode(PROMPT)
    engine.add_request("abort-me", ids, SamplingParams(max_tokens=50, structured=StructuredSpec("json_object")))
    engine.step()
    assert len(engine.structured) == 1
    engine.abort_request("abort-me")
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.structured) == 0
    for spec, words in [(StructuredSpec("json_schema", {"type": "strin"}), "Unsupported type"),
                        (StructuredSpec("regex", "(a|b"), "parenthesis"),
                        (StructuredSpec("grammar", "root ::= nothing"), "not defined")]:  # fmt: skip
        with pytest.raises(GrammarError, match=words) as info:
            engine.add_request("bad", ids, SamplingParams(structured=spec))
        assert "xgrammar cannot compile" in str(info.value) and "/project/" not in str(info.value)
        assert len(engine.structured) == 0 and not engine.has_unfinished_requests()


def test_spec_validation_and_keys() -> None:
    assert StructuredSpec("json_schema", {"b": 1, "a": 2}).key == StructuredSpec("json_schema", {"a": 2, "b": 1}).key
    for kind, value in [("json_schema", []), ("regex", ""), ("choice", ()), ("choice", ("a", "")),
                        ("json_object", {}), ("xml", None)]:  # fmt: skip
        with pytest.raises(ValueError):
            StructuredSpec(kind, value)
    assert ebnf_literal('a"\\\n\x01é') == '"a\\"\\\\\\n\\x01é"'


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_min_tokens_gives_way_to_a_complete_grammar(engine: LLMEngine) -> None:
    """Once the grammar is complete only EOS may follow, and min_tokens bans EOS: EOS wins, and no
    token outside the grammar (a special token, say) is sampled from an all -inf row."""
    ids = engine.tokenizer.encode(PROMPT)
    tokens: dict[str, list[int]] = {}
    for i in range(3):
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=30, min_tokens=10,
                                structured=StructuredSpec("choice", ("ab", "cd")))  # fmt: skip
        engine.add_request(f"mt{i}", ids, params)
        tokens[f"mt{i}"] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    eos = set(engine.tokenizer.eos_token_ids)
    for got in tokens.values():
        text = engine.tokenizer.decode(got[:-1])
        assert text in ("ab", "cd") and got[-1] in eos, got
        assert engine.tokenizer.decode(got[:-1], skip_special_tokens=False) == text, got  # no hidden special token


def test_a_token_outside_the_grammar_ends_the_row_with_eos(engine: LLMEngine) -> None:
    import torch

    seq = Sequence("broken", [5], SamplingParams(structured=StructuredSpec("regex", "[0-9]+")))
    seq.append_token(engine.tokenizer.encode("x", add_special_tokens=False)[0])  # "x" is not a digit
    structured = engine.structured
    structured.add("broken", seq.params.structured)  # type: ignore[arg-type]
    try:
        vocab = engine.model_config.vocab_size
        masked = structured.apply(torch.zeros(1, vocab), [seq])
        allowed = torch.isfinite(masked[0]).nonzero()[:, 0].tolist()
        assert allowed == sorted(engine.tokenizer.eos_token_ids)
    finally:
        structured.release("broken")


def test_ignore_eos_holds_the_grammar_until_its_eos_then_runs_free(engine: LLMEngine) -> None:
    """As vLLM: the EOS that completes the grammar does not stop the row; from there it is unmasked
    (its matcher is dropped) and generates up to max_tokens."""
    ids = engine.tokenizer.encode(PROMPT)
    eos = set(engine.tokenizer.eos_token_ids)
    schema = {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"], "additionalProperties": False}
    specs = [StructuredSpec("json_schema", schema), StructuredSpec("choice", ("ab", "cd"))]
    tokens: dict[str, list[int]] = {}
    for i, spec in enumerate(specs * 2):
        engine.add_request(f"free{i}", ids, SamplingParams(temperature=1.0, seed=i, max_tokens=60, ignore_eos=True,
                                                           structured=spec))  # fmt: skip
        tokens[f"free{i}"] = []
    reasons: dict[str, str | None] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    assert len(engine.structured) == 0
    for i, spec in enumerate(specs * 2):
        got = tokens[f"free{i}"]
        assert len(got) == 60 and reasons[f"free{i}"] == "length", got
        end = next(k for k, t in enumerate(got) if t in eos)  # the grammar's end
        constrained = engine.tokenizer.decode(got[:end])
        if spec.kind == "json_schema":
            jsonschema.validate(json.loads(constrained), schema)
        else:
            assert constrained in ("ab", "cd"), constrained
        free = got[end + 1 :]
        # unmasked, the random model writes anything: a masked row could only repeat EOS
        assert len(set(free) - eos) > 5, free
