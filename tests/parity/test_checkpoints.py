"""make-model checkpoints, weight verification, tokenizer, scoring, stop strings and the stats feed."""

from __future__ import annotations

import json
import math

import pytest

from kvpilot.cli import main as cli_main
from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm import LLM
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.metrics.stats_contract import HISTOGRAM_KEYS, LATENCY_BUCKETS_SECONDS
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.worker.loader import WeightIntegrityError, sha256_file
from tests.helpers.models import hf_greedy

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    out = tmp_path_factory.mktemp("small") / "llama-small"
    assert cli_main(["make-model", str(out), "--family", "llama", "--size", "small", "--seed", "3"]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "qwen2-tiny"
    assert cli_main(["make-model", str(out), "--family", "qwen2"]) == 0
    return out


def test_small_sharded_make_model_matches_hf(small_llama) -> None:
    index = json.loads((small_llama / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    prompts = [[5, 9, 300, 17], list(range(3, 40))]
    expected = hf_greedy(small_llama, prompts, 6)
    llm = LLM(str(small_llama), dtype="float32", show_progress=False)
    got = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    assert [g["token_ids"] for g in got] == expected


def test_sha256_pins_refuse_a_mismatch(tiny_qwen) -> None:
    good = sha256_file(tiny_qwen / "model.safetensors")
    LLMEngine(
        EngineConfig(model=str(tiny_qwen), weight_sha256={"model.safetensors": good}, show_progress=False)
    )
    wrong = "0" * 64
    with pytest.raises(WeightIntegrityError) as info:
        LLMEngine(
            EngineConfig(
                model=str(tiny_qwen), weight_sha256={"model.safetensors": wrong}, show_progress=False
            )
        )
    message = str(info.value)
    assert "model.safetensors" in message and wrong in message and good in message


def test_tokenizer_agrees_with_transformers(tiny_qwen) -> None:
    transformers = pytest.importorskip("transformers")
    engine = LLMEngine(EngineConfig(model=str(tiny_qwen), show_progress=False))
    tok = engine.tokenizer
    # The generic fast tokenizer reads tokenizer.json as written (AutoTokenizer would swap in
    # Qwen2's own pre-tokenizer regex for model_type qwen2).
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(tiny_qwen)
    text = "def héllo(world):\n    return {'ünïcode': 42}  # ✓"
    ids = tok.encode(text)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.eos_token_id == 1 and tok.vocab_size <= engine.model_config.vocab_size
    messages = [{"role": "user", "content": "hi"}]
    rendered = tok.apply_chat_template(messages)
    assert rendered == hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<bos>") and rendered.endswith("<|assistant|>\n")
    # tools and tool calls render as transformers renders them (its tojson: no HTML escaping)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"q": "<a & b>"}}}
    chat = [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "1"}]
    rendered = tok.apply_chat_template(chat, tools=tools)
    assert rendered == hf_tok.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '"<a & b>"' in rendered and "<tool_call>f</tool_call>" in rendered


def test_score_matches_transformers(tiny_qwen) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    engine = LLMEngine(EngineConfig(model=str(tiny_qwen), show_progress=False))
    prompt, continuation = [4, 8, 15, 16], [23, 42, 108]
    got = engine.score(prompt, continuation)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + continuation])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    want = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(continuation)]
    assert got == pytest.approx(want, abs=1e-4)


def test_stop_string_truncates_text(tiny_qwen) -> None:
    llm = LLM(str(tiny_qwen), show_progress=False)
    prompt = "import os\n"
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    text = free["text"]
    assert len(text) >= 4
    stop = text[2:4]
    cut = text.find(stop)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))[
        0
    ]
    assert out["finish_reason"] == "stop"
    assert out["text"] == text[:cut]
    assert len(out["token_ids"]) <= len(free["token_ids"])


def test_seeded_sampling_is_reproducible(tiny_qwen) -> None:
    llm = LLM(str(tiny_qwen), show_progress=False)
    params = SamplingParams(temperature=1.5, top_p=0.95, seed=11, max_tokens=8, ignore_eos=True)
    a, b = llm.generate(["hello", "hello"], [params, params])
    assert a["token_ids"] == b["token_ids"]
    c = llm.generate(
        ["hello"], SamplingParams(temperature=1.5, top_p=0.95, seed=12, max_tokens=8, ignore_eos=True)
    )[0]
    assert c["token_ids"] != a["token_ids"]


def test_stats_feed_and_abort(tiny_qwen) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_qwen), block_size=16, show_progress=False))
    engine.add_request("a", list(range(3, 23)), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    engine.add_request("b", list(range(3, 8)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.step()
    feed = engine.stats()
    assert set(feed) == {
        "schema_version", "engine", "kv", "prefix_cache", "memory_bytes", "requests", "latency",
        "linear", "gqa_head_utilization", "validation", "vllm",
    }  # fmt: skip
    kv = feed["kv"]
    assert kv["blocks_used"] == 3 and kv["blocks_free"] + kv["blocks_used"] == kv["blocks_total"]
    assert kv["live_token_slots"] == 25 and kv["allocated_token_slots"] == 48
    assert kv["efficiency"] == pytest.approx(25 / 48)
    memory = feed["memory_bytes"]
    assert (
        memory["kv_used"] == 3 * kv["bytes_per_block"]
        and memory["weights"] > 0
        and memory["activation_peak"] > 0
    )
    while any(not o.finished for o in engine.step() if o.request_id == "b"):
        pass
    engine.abort_request("a")
    assert engine.stats()["kv"]["blocks_used"] == 0
    outs = engine.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [("a", True, "abort")]
    assert not engine.has_unfinished_requests()
    engine.record_rejection("too_long")
    feed = engine.stats()
    req = feed["requests"]
    assert req["finished_total"] == 1 and req["aborted_total"] == 1 and req["rejected_total"]["too_long"] == 1
    assert req["prompt_tokens_total"] == 25 and req["generation_tokens_total"] >= 3
    for key in HISTOGRAM_KEYS:
        hist = feed["latency"][key]
        assert (
            len(hist["buckets"]) == len(LATENCY_BUCKETS_SECONDS) + 1 and hist["buckets"][-1] == hist["count"]
        )
    assert feed["latency"]["ttft_seconds"]["count"] == 2 and feed["latency"]["e2e_seconds"]["count"] == 1
    vllm = feed["vllm"]  # the API port's vllm: series: same requests on vLLM's bucket bounds
    assert vllm["ttft_seconds"]["count"] == 2 and vllm["ttft_seconds"]["buckets"][-1] == 2
    assert vllm["finished_total"] == {"stop": 0, "length": 1, "abort": 1}
    assert math.isfinite(feed["engine"]["start_time_seconds"]) and feed["engine"]["device"] == "cpu"


def test_bad_requests_are_refused(tiny_qwen) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_qwen), max_model_len=32, show_progress=False))
    with pytest.raises(ValueError, match="at most 31"):
        engine.add_request("long", [5] * 32, SamplingParams())
    with pytest.raises(ValueError, match=r"integers in \[0, 384\)"):
        engine.add_request("oov", [5, 10_000], SamplingParams())
    engine.add_request("x", [5], SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("x", [5], SamplingParams())


def test_generation_config_eos_ids_stop_generation(tiny_qwen, tmp_path) -> None:
    import shutil

    first = LLM(str(tiny_qwen), show_progress=False).generate(
        ["hello"], SamplingParams(temperature=0, max_tokens=3)
    )
    token = first[0]["token_ids"][0]
    model = tmp_path / "model"
    shutil.copytree(tiny_qwen, model)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, token]}))
    out = LLM(str(model), show_progress=False).generate(
        ["hello"], SamplingParams(temperature=0, max_tokens=3)
    )[0]
    assert out["token_ids"] == [token] and out["finish_reason"] == "stop"
