"""The engine's Performer decode, batched across sequences, against its former per-sequence loop.

Same checkpoint, same short window (so the summary is built by the prefill loop and then folded by the
batched decode), prompts shorter and longer than the window decoding side by side: the greedy tokens
and the summaries left in the state pool must be those of `batched_decode = False`.
"""

from __future__ import annotations

import random

import pytest
import torch

from kvpilot.engine.llm import LLM
from kvpilot.engine.strategies.linear.attention import PerformerAttention
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import greedy_ids

pytestmark = pytest.mark.parity

_rng = random.Random(5)
PROMPTS = [[_rng.randrange(3, 384) for _ in range(n)] for n in (1, 3, 6, 11, 29)]


def run(path: str, batched: bool) -> tuple[list[list[int]], list[torch.Tensor]]:
    llm = LLM(path, show_progress=False, attention="linear", linear_window=6, linear_features=32)
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, PerformerAttention)]
    assert layers
    for layer in layers:
        layer.batched_decode = batched
    tokens = greedy_ids(llm, PROMPTS, 12, ignore_eos=True)
    return tokens, [layer.state_pool.clone() for layer in layers]


def test_batched_decode_gives_the_per_sequence_tokens_and_summaries(tmp_path) -> None:
    path = str(build_hf_checkpoint(tmp_path / "llama", "llama", seed=5, num_key_value_heads=2))
    want_tokens, want_states = run(path, batched=False)
    got_tokens, got_states = run(path, batched=True)
    assert got_tokens == want_tokens
    assert any(s.abs().sum() > 0 for s in want_states), "keys left the window into the summaries"
    for got, want in zip(got_states, want_states, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
