"""Penalties, logit_bias and min_tokens, batched, against a per-row reference written from the
definitions (OpenAI's presence/frequency penalties; HF's repetition penalty)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.worker.logits_processors import apply_logits_processors

pytestmark = pytest.mark.unit

VOCAB, EOS = 50, (2, 7)


@dataclass
class FakeSeq:
    params: SamplingParams
    token_ids: list[int]
    num_prompt_tokens: int

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def reference(row: torch.Tensor, seq: FakeSeq) -> torch.Tensor:
    p, out = seq.params, row.clone()
    completion = seq.token_ids[seq.num_prompt_tokens :]
    for t in range(VOCAB):
        n = completion.count(t)
        out[t] -= p.frequency_penalty * n + (p.presence_penalty if n else 0.0)
        if t in seq.token_ids and p.repetition_penalty != 1.0:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t, bias in p.logit_bias.items():
        out[t] += bias
    if seq.num_completion_tokens < p.min_tokens:
        for t in (*([] if p.ignore_eos else EOS), *p.stop_token_ids):
            out[t] = float("-inf")
    return out


def random_seq(rng: random.Random) -> FakeSeq:
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))]
    completion = [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 12))]
    params = SamplingParams(
        max_tokens=32,
        presence_penalty=rng.choice([0.0, 0.5, -1.0, 2.0]),
        frequency_penalty=rng.choice([0.0, 0.3, -0.7]),
        repetition_penalty=rng.choice([1.0, 1.3, 0.8]),
        logit_bias={rng.randrange(VOCAB): rng.uniform(-100, 100) for _ in range(rng.randrange(3))},
        min_tokens=rng.choice([0, 5, 20]),
        stop_token_ids=rng.choice([[], [11]]),
        ignore_eos=rng.random() < 0.2,
    )
    return FakeSeq(params, prompt + completion, len(prompt))


@pytest.mark.parametrize("seed", range(5))
def test_batched_processors_match_the_reference(seed):
    rng = random.Random(seed)
    seqs = [random_seq(rng) for _ in range(9)] + [FakeSeq(SamplingParams(), [1, 2, 3], 2)]  # last: untouched
    logits = torch.randn(len(seqs), VOCAB, generator=torch.Generator().manual_seed(seed))
    got = apply_logits_processors(logits, seqs, EOS)
    want = torch.stack([reference(row, seq) for row, seq in zip(logits, seqs, strict=True)])
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = ~torch.isinf(want)
    assert torch.allclose(got[finite], want[finite], atol=1e-5)
    assert torch.equal(got[-1], logits[-1])


def test_nothing_asked_returns_the_same_tensor():
    logits = torch.randn(2, VOCAB)
    seqs = [FakeSeq(SamplingParams(), [1], 1), FakeSeq(SamplingParams(temperature=0), [4, 5], 1)]
    assert apply_logits_processors(logits, seqs, EOS) is logits


@pytest.mark.parametrize(
    ("kw", "message"),
    [({"presence_penalty": 2.5}, "presence_penalty"), ({"repetition_penalty": 0}, "repetition_penalty"),
     ({"logit_bias": {3: 101}}, "logit_bias"), ({"min_tokens": 40, "max_tokens": 8}, "min_tokens")],
)  # fmt: skip
def test_invalid_values_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kw)
