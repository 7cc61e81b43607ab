"""GPU tier, multi-GPU: tensor parallelism over NCCL (two GPUs) gives the one-GPU engine's greedy tokens,
fp32, with prefix caching and preemption; NVLink multicast stays off. Skipped with fewer than 2 GPUs."""

from __future__ import annotations

import os

import pytest

from kvpilot.engine.llm import LLM
from tests.parity.helpers import greedy_ids, mixed_prompts
from tests.parity.test_tensor_parallel import PREEMPT, VARIANTS, build

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
PROMPTS = mixed_prompts()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism on CUDA needs >= 2 GPUs")
@pytest.mark.parametrize("name", list(VARIANTS))
def test_two_gpus_match_one(tmp_path, name: str) -> None:
    path = str(build(tmp_path / name, name))
    knobs = {"device": "cuda", "dtype": "float32", "show_progress": False, **PREEMPT}
    one = LLM(path, **knobs)
    want = greedy_ids(one, PROMPTS, 8)
    del one
    llm = LLM(path, tensor_parallel_size=2, **knobs)
    try:
        assert os.environ.get("NCCL_NVLS_ENABLE") == "0"
        assert llm.engine.runner.device == torch.device("cuda", 0)
        assert greedy_ids(llm, PROMPTS, 8) == want
        assert llm.engine.scheduler.num_preemptions > 0
    finally:
        llm.shutdown()
