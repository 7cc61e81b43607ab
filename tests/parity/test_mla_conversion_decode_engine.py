"""The MLA conversion's batched V-absorbed decode against its former decompress-everything decode, in the engine.

Same checkpoint, same schedule (chunked prefill beside decodes, a small pool forcing preemption):
every step's logits agree within fp32 rounding and the greedy tokens are identical, at a truncated
rank (where the latent is lossy, so both paths must read the same approximation) and at full rank.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.llm import LLM
from tests.helpers.logits import record_logits
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import greedy_ids, mixed_prompts

pytestmark = pytest.mark.parity

PROMPTS = mixed_prompts(seed=3)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return str(
        build_hf_checkpoint(tmp_path_factory.mktemp("llama-gqa"), "llama", seed=2, num_key_value_heads=2)
    )


def run(path: str, rank: int, batched: bool) -> tuple[list[list[int]], list[torch.Tensor]]:
    llm = LLM(path, show_progress=False, attention="mla", latent_rank=rank, num_kv_blocks=12, block_size=8,
              max_num_batched_tokens=16)  # fmt: skip
    model = llm.engine.runner.model
    layers = [layer.self_attn for layer in model.model.layers]
    for attn in layers:
        attn.batched_decode = batched
    logits = record_logits(model)
    ids = greedy_ids(llm, PROMPTS, 10, ignore_eos=True)
    assert llm.engine.scheduler.num_preemptions > 0, "the small pool was meant to force preemption"
    return ids, logits


@pytest.mark.parametrize("rank", [16, 64])
def test_batched_decode_equals_decompressing_decode(llama: str, rank: int) -> None:
    expected_ids, expected_logits = run(llama, rank, batched=False)
    ids, logits = run(llama, rank, batched=True)
    assert ids == expected_ids
    assert len(logits) == len(expected_logits)
    for got, want in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
