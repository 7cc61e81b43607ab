"""The partial-RoPE MLA conversion (`mla_rope_dims`) in the engine: absorbed decode against references.

- RoPE kept on every dim at full rank reproduces the checkpoint: the engine's greedy tokens equal HF's
  (checks the query/key dim bookkeeping, the post-RoPE rope rows and the absorption together).
- At a truncated rank and few RoPE dims (a lossy model) the absorbed decode equals the same model's
  decompress-then-attend decode (prefill path) step by step, with chunked prefill, prefix hits and
  preemption, with the default pairs and with calibrated (`turn`) ones.
- Runtime validation and the fallback reserve work for the mode: a rank-1 latent fails its check and
  the sequence continues as the exact engine does; sequences on both pools share steps.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.llm import LLM
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.strategies.mla.partial import PartialRopeMlaAttention
from tests.helpers.logits import record_logits
from tests.helpers.models import build_hf_checkpoint, hf_greedy
from tests.parity.helpers import engine_greedy, greedy_ids, make_engine, mixed_prompts

pytestmark = pytest.mark.parity

PROMPTS = mixed_prompts(seed=3)
CALIBRATION = __file__  # any text not held out: this file


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    # 4 query heads on 2 KV heads of head_dim 16, hidden 64
    return str(build_hf_checkpoint(tmp_path_factory.mktemp("llama-gqa"), "llama", seed=2, num_key_value_heads=2))


def run(path: str, batched: bool, **engine: object) -> tuple[list[list[int]], list[torch.Tensor], LLM]:
    llm = LLM(path, show_progress=False, attention="mla", num_kv_blocks=12, block_size=8,
              max_num_batched_tokens=16, **engine)  # fmt: skip
    model = llm.engine.runner.model
    for layer in model.model.layers:
        assert isinstance(layer.self_attn, PartialRopeMlaAttention)
        layer.self_attn.batched_decode = batched
    logits = record_logits(model)
    ids = greedy_ids(llm, PROMPTS, 10, ignore_eos=True)
    assert llm.engine.scheduler.num_preemptions > 0, "the small pool was meant to force preemption"
    return ids, logits, llm


def test_rope_on_every_dim_at_full_rank_matches_hf(llama: str) -> None:
    ids, _, llm = run(llama, batched=True, latent_rank=32, mla_rope_dims=16)
    mla = llm.engine.runner.mla
    assert mla.absorbed_decode and mla.latent_width == 32 + 2 * 16
    assert ids == hf_greedy(llama, PROMPTS, 10)


@pytest.mark.parametrize(
    ("rank", "rope_dims", "extra"),
    [(12, 4, {}), (24, 0, {}), (20, 6, {"conversion_calibration": CALIBRATION})],  # calibrated: `turn` pairs
)
def test_absorbed_decode_equals_decompressing_decode(llama: str, rank: int, rope_dims: int, extra: dict) -> None:
    expected_ids, expected_logits, _ = run(llama, False, latent_rank=rank, mla_rope_dims=rope_dims, **extra)
    ids, logits, llm = run(llama, True, latent_rank=rank, mla_rope_dims=rope_dims, **extra)
    assert llm.engine.runner.mla.latent_width == rank + 2 * rope_dims
    assert ids == expected_ids
    assert len(logits) == len(expected_logits)
    for got, want in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_norm_rule_picks_per_head_pairs_from_calibration(llama: str) -> None:
    llm = LLM(llama, show_progress=False, attention="mla", latent_rank=20, mla_rope_dims=6,
              mla_rope_pairs="norm", conversion_calibration=CALIBRATION)  # fmt: skip
    high = LLM(llama, show_progress=False, attention="mla", latent_rank=20, mla_rope_dims=6)
    picked = [layer.self_attn.rope_index for layer in llm.engine.runner.model.model.layers]
    default = [layer.self_attn.rope_index for layer in high.engine.runner.model.model.layers]
    assert all(torch.equal(d, torch.tensor([[0, 1, 2, 8, 9, 10]] * 2)) for d in default)
    assert any(not torch.equal(p, d) for p, d in zip(picked, default, strict=True))


EVERY, NEW = 4, 14
GUARDED = {"validate_every": EVERY, "validation_sample_rate": 1.0, "validation_threshold": 0.92,
           "fallback_reserve": 0.5}  # fmt: skip


def engine(path: str, **kw) -> LLMEngine:
    return make_engine(path, **{"device": "cpu", "block_size": 8, "num_kv_blocks": 64, **kw})


def prompt_of(n: int, seed: int = 0) -> list[int]:
    return [(i * 37 + 11 + seed * 101) % 370 + 3 for i in range(n)]


def test_rank_one_partial_rope_conversion_falls_back_to_the_unconverted_layers(llama: str) -> None:
    eng = engine(llama, attention="mla", latent_rank=1, mla_rope_dims=2, num_kv_blocks=2048, **GUARDED)
    prompt = prompt_of(40)
    got = engine_greedy(eng, [prompt], NEW, ["r"])[0]
    feed = eng.stats()["validation"]
    assert feed["checks_total"] == 1 and sum(feed["fallbacks_total"]["mla"].values()) == 1, feed
    assert feed["unrecovered_total"] == {}
    k = EVERY + 1
    assert got[k:] == engine_greedy(engine(llama), [prompt + got[:k]], NEW - k)[0]
    assert eng.block_manager.num_used_blocks == 0


def test_reserve_and_absorbed_sequences_share_steps(llama: str) -> None:
    """'b' is validated (rate 0.5 by request id) and moves to the K/V reserve; 'a' stays on the latent
    pool and must decode exactly as without a reserve (absorbed, in split steps)."""
    mla = {"attention": "mla", "latent_rank": 1, "mla_rope_dims": 2, "num_kv_blocks": 2048}
    eng = engine(llama, **mla, **{**GUARDED, "validation_sample_rate": 0.5})
    prompts = [prompt_of(40), prompt_of(33, seed=2)]
    got = engine_greedy(eng, prompts, NEW, ["a", "b"])
    feed = eng.stats()["validation"]
    assert feed["fallbacks_total"]["mla"]["low_cosine"] == 1 and feed["checks_total"] == 1
    k = EVERY + 1
    assert got[1][k:] == engine_greedy(engine(llama), [prompts[1] + got[1][:k]], NEW - k)[0]
    assert got[0] == engine_greedy(engine(llama, **mla), [prompts[0]], NEW)[0]
