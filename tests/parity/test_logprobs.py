"""Token log-probabilities (the OpenAI `logprobs` fields) against HF's log-softmax: the sampled
tokens' (served, paged path) and the echoed prompt's (engine.score_tokens, /v1/score's path)."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import drain, make_engine

pytestmark = pytest.mark.parity

PROMPT = [4, 8, 15, 16, 23, 42, 108, 7, 99]
TOP = 5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("logprobs"), "qwen2", num_key_value_heads=2)


def hf_logprobs(path, tokens: list[int]) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), -1)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampled_token_logprobs_match_hf(ckpt, temperature):
    eng = make_engine(ckpt)
    params = SamplingParams(temperature=temperature, seed=3, max_tokens=12, ignore_eos=True, logprobs=TOP)
    eng.add_request("r", PROMPT, params)
    outputs = []
    while eng.has_unfinished_requests():
        outputs += [o for o in eng.step() if o.request_id == "r"]
    tokens = [t for o in outputs for t in o.new_token_ids]
    entries = [e for o in outputs for e in o.logprobs]
    assert len(tokens) == len(entries) == 12
    ref = hf_logprobs(ckpt, PROMPT + tokens)
    for i, (token, (lp, top)) in enumerate(zip(tokens, entries, strict=True)):
        row = ref[len(PROMPT) - 1 + i]
        assert lp == pytest.approx(row[token].item(), abs=1e-4)  # the model's distribution, before temperature
        assert len(top) == TOP and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
        want_values, want_ids = row.topk(TOP)
        assert [v for _, v in top] == pytest.approx(want_values.tolist(), abs=1e-4)
        assert top[0][0] == want_ids[0].item()
        if temperature == 0.0:
            assert top[0][0] == token


def test_prompt_logprobs_match_hf(ckpt):
    eng = make_engine(ckpt)
    chosen, tops = eng.score_tokens(PROMPT[:1], PROMPT[1:], 3)
    ref = hf_logprobs(ckpt, PROMPT)
    want = [ref[i, t].item() for i, t in enumerate(PROMPT[1:])]
    assert chosen == pytest.approx(want, abs=1e-4)
    assert [[i for i, _ in top] for top in tops] == ref[:-1].topk(3).indices.tolist()


def test_no_logprobs_unless_asked(ckpt):
    eng = make_engine(ckpt)
    eng.add_request("plain", PROMPT, SamplingParams(max_tokens=3, temperature=0))
    eng.add_request("asked", PROMPT, SamplingParams(max_tokens=3, temperature=0, logprobs=0))
    got: dict[str, list] = {"plain": [], "asked": []}
    while eng.has_unfinished_requests():
        for o in eng.step():
            got[o.request_id].append(o.logprobs)
    assert all(x is None for x in got["plain"])
    assert all(len(x) == 1 and x[0][1] == [] for x in got["asked"])
    assert drain(eng) == {}
