"""MLA conversion (attention="mla", latent_rank=r) against the exact path on the same checkpoint.

Logit cosine and top-1 agreement of next-token logits at every position of a few prompts, at
several ranks of a tiny random GQA Llama (K/V rows 2 x 2 heads x 16 = 64 = hidden, so r = 64 is
full rank); the reconstruction error reported at load; full rank served through the paged latent
cache (chunked prefill, prefix caching, preemption) equal to the exact engine token for token;
--disable-mla equal to the exact engine. Bounds (docs/strategies.md, "MLA in the engine"), measured
on these random weights (which have no low-rank structure: the worst case for SVD truncation), with
a margin; measured values are in docs/strategies.md.
"""

from __future__ import annotations

import random

import pytest
import torch

from kvpilot.engine.llm import LLM
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import assert_replay_and_release, dense_logits, greedy_ids

pytestmark = pytest.mark.parity

FULL_RANK = 64
# rank -> (min mean logit cosine, min top-1 agreement, max mean relative K/V reconstruction error)
BOUNDS = {
    8: (0.15, 0.0, 0.82),
    16: (0.35, 0.03, 0.65),
    32: (0.75, 0.20, 0.36),
    48: (0.95, 0.50, 0.14),
    56: (0.99, 0.70, 0.06),
    FULL_RANK: (0.999999, 1.0, 1e-6),
}


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, 384) for _ in range(20)]
    return [[rng.randrange(3, 384) for _ in range(n)] for n in (6, 19, 33)] + [[*shared, 5], [*shared, 7, 9]]


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return str(
        build_hf_checkpoint(tmp_path_factory.mktemp("llama-gqa"), "llama", seed=1, num_key_value_heads=2)
    )


def _compare(exact: LLM, approx: LLM) -> tuple[float, float]:
    cosines, agree, total = [], 0, 0
    for prompt in PROMPTS:
        a, b = dense_logits(exact, prompt), dense_logits(approx, prompt)
        cosines.append(torch.nn.functional.cosine_similarity(a, b, dim=-1))
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    return float(torch.cat(cosines).mean()), agree / total


def test_logit_cosine_and_top1_improve_with_rank(llama) -> None:
    exact = LLM(llama, show_progress=False)
    results = {}
    for rank, (min_cos, min_top1, max_err) in BOUNDS.items():
        llm = LLM(llama, show_progress=False, attention="mla", latent_rank=rank)
        mla = llm.engine.stats()["engine"]["mla"]
        assert mla["mode"] == "converted" and mla["latent_width"] == rank
        cos, top1 = _compare(exact, llm)
        results[rank] = (cos, top1, mla["reconstruction_error"])
        assert cos >= min_cos and top1 >= min_top1 and mla["reconstruction_error"] <= max_err, (
            rank,
            results[rank],
        )
    ranks = sorted(results)
    errors = [results[r][2] for r in ranks]
    assert errors == sorted(errors, reverse=True), f"reconstruction error must fall with rank: {results}"
    cosines = [results[r][0] for r in ranks]
    assert cosines == sorted(cosines), f"logit cosine must rise with rank: {results}"


def test_full_rank_paged_path_equals_exact(llama) -> None:
    expected = greedy_ids(LLM(llama, show_progress=False), PROMPTS, 8)
    small = {"num_kv_blocks": 10, "block_size": 8, "max_num_batched_tokens": 16, "fallback_reserve": 0.0}
    llm = LLM(llama, show_progress=False, attention="mla", latent_rank=FULL_RANK, **small)
    runner = llm.engine.runner
    assert tuple(runner.kv_cache.shape) == (2, 10, 8, FULL_RANK)
    assert runner.bytes_per_block == 2 * 8 * FULL_RANK * 4  # layers x tokens x latent x fp32
    assert greedy_ids(llm, PROMPTS, 8) == expected
    assert llm.engine.scheduler.num_preemptions > 0, "the tiny pool was meant to force preemption"
    assert llm.engine.config.enable_prefix_caching
    assert_replay_and_release(llm, PROMPTS, expected, 8)


def test_disable_mla_serves_the_original_attention(llama) -> None:
    exact = LLM(llama, show_progress=False)
    off = LLM(llama, show_progress=False, attention="mla", latent_rank=8, disable_mla=True)
    assert off.engine.stats()["engine"]["mla"]["mode"] == "off"
    assert off.engine.runner.bytes_per_block == exact.engine.runner.bytes_per_block
    assert greedy_ids(off, PROMPTS, 6) == greedy_ids(exact, PROMPTS, 6)


def test_mla_settings_are_checked(llama) -> None:
    with pytest.raises(ValueError, match="needs latent_rank"):
        LLM(llama, show_progress=False, attention="mla")
    with pytest.raises(ValueError, match=r"latent_rank=65 must be within 1\.\.64"):
        LLM(llama, show_progress=False, attention="mla", latent_rank=65)
    with pytest.raises(ValueError, match="latent_rank applies to attention='mla' only"):
        LLM(llama, show_progress=False, latent_rank=8)
    with pytest.raises(ValueError, match="eviction is not available with the MLA conversion"):
        LLM(llama, show_progress=False, attention="mla", latent_rank=8, eviction="sinks")
    with pytest.raises(ValueError, match="not available for an MLA latent cache"):
        LLM(llama, show_progress=False, attention="mla", latent_rank=8, kv_cache_dtype="int8")


@pytest.mark.parametrize(("rank", "low", "high", "fallbacks"), [(FULL_RANK, 0.99999, 1.00001, 0), (8, -1.0, 0.92, 2)])
def test_runtime_validation_compares_with_the_original_kv(llama, rank: int, low: float, high: float,
                                                          fallbacks: int) -> None:
    """Every 2nd decode token: the served layer output vs a dense pass with the checkpoint's own K/V; a low
    cosine moves the sequence to the K/V fallback reserve (tests/parity/test_runtime_guards.py)."""
    llm = LLM(llama, show_progress=False, attention="mla", latent_rank=rank, validate_every=2,
              validation_sample_rate=1.0)  # fmt: skip
    greedy_ids(llm, PROMPTS[:2], 6)
    validation = llm.engine.stats()["validation"]
    assert validation["checks_total"] >= 2
    assert low <= validation["last_cosine"] <= high
    assert sum(validation["fallbacks_total"]["mla"].values()) == fallbacks
