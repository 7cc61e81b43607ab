"""LLMEngine.score sees what serving computes: an 8-bit KV cache (int8, fp8, auto switching) or a
recurrent state is scored through the paged serving path, so a canary's accuracy probe can tell
it from stable; an engine whose cache holds exactly what the dense computation does is unchanged."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.worker.scoring import scores_through_cache
from tests.helpers.forced_logits import teacher_forced_logits
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import make_engine

pytestmark = pytest.mark.parity

PROMPT = [5, 17, 99, 3, 250, 41, 77, 8, 120, 64, 33]
CONTINUATION = [12, 300, 7, 45, 210, 9, 150, 66, 18, 91, 240, 4, 55, 380, 27, 6, 133, 70, 21]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("paged-score"), "llama", num_key_value_heads=2)


def engine(path, **kw):
    return make_engine(path, block_size=8, num_kv_blocks=32, **kw)


def forced_logprobs(eng) -> list[float]:
    """log p of each continuation token as served: prefill, then one decode step per forced token."""
    logits = teacher_forced_logits(eng, [PROMPT], [CONTINUATION])[0]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(CONTINUATION)[:, None])[:, 0].tolist()


def test_model_dtype_cache_scores_densely_and_unchanged(ckpt):
    eng = engine(ckpt)
    assert not eng.scores_through_cache
    assert eng.score(PROMPT, CONTINUATION) == eng.runner.score(PROMPT, CONTINUATION)
    assert eng.score(PROMPT, CONTINUATION) == pytest.approx(forced_logprobs(engine(ckpt)), abs=1e-4)


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_8bit_cache_scores_like_serving(ckpt, kv):
    exact = engine(ckpt).score(PROMPT, CONTINUATION)
    eng = engine(ckpt, kv_cache_dtype=kv)
    assert eng.scores_through_cache
    got = eng.score(PROMPT, CONTINUATION)
    assert max(abs(a - b) for a, b in zip(got, exact, strict=True)) > 1e-5, "8-bit KV scored like the exact cache"
    # the same engine: fp8's per-layer scale is calibrated once, by the first write, then fixed
    assert got == pytest.approx(forced_logprobs(eng), abs=2e-3)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks  # scoring gave its blocks back
    assert eng.stats()["requests"]["running"] == 0


def test_auto_switching_scores_on_the_pool_serving_would_use(ckpt):
    exact = engine(ckpt).score(PROMPT, CONTINUATION)
    int8 = engine(ckpt, kv_cache_dtype="int8").score(PROMPT, CONTINUATION)
    eng = engine(ckpt, kv_quant_auto_threshold=1)  # int8 blocks once one sequence is running
    assert eng.scores_through_cache
    assert eng.score(PROMPT, CONTINUATION) == pytest.approx(exact, abs=1e-5)  # alone: 16-bit blocks
    eng.add_request("running", PROMPT, SamplingParams(max_tokens=40, ignore_eos=True))
    eng.step()
    got = eng.score(PROMPT, CONTINUATION)  # one running: a new sequence would get int8 blocks
    assert max(abs(a - b) for a, b in zip(got, exact, strict=True)) > 1e-5
    assert got == pytest.approx(int8, abs=1e-5)
    eng.abort_request("running")
    eng.step()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert eng.block_manager.sequences_per_pool() == {"16": 0, "8": 0}


def test_linear_attention_scores_with_its_state(ckpt):
    eng = engine(ckpt, attention="linear")
    assert eng.scores_through_cache
    got = eng.score(PROMPT, CONTINUATION)
    assert got == pytest.approx(forced_logprobs(engine(ckpt, attention="linear")), abs=2e-3)


def test_decision_by_configuration(ckpt):
    runner = engine(ckpt).runner
    assert not scores_through_cache(runner, None)
    assert scores_through_cache(runner, object())  # eviction on
