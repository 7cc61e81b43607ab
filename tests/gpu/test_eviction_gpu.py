"""GPU tier: eviction and runtime validation on CUDA with the compiled Triton kernels.

fp32 against HF fp32 with the evicted positions masked (tests/parity/test_eviction_engine.py);
tokens are compared up to the first near-tie of HF's own logits (< 1e-3 between the top two),
as in tests/gpu/test_engine_gpu.py. Run on the device:

    pytest -m gpu tests/gpu/test_eviction_gpu.py -q
"""

from __future__ import annotations

import pytest

from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.models import build_hf_checkpoint
from tests.parity.test_eviction_engine import BS, prompt_of, visible_mask

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("evict-gpu") / "llama", "llama")


def cuda_engine(ckpt, **kw):
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine

    base = dict(model=str(ckpt), device="cuda", dtype="float32", block_size=BS, show_progress=False, num_kv_blocks=64)
    return LLMEngine(EngineConfig(**{**base, **kw}))


@pytest.mark.parametrize("mode", ["sinks", "ladder"])
def test_eviction_on_cuda_matches_masked_hf(ckpt, mode):
    import transformers

    prompt, n = prompt_of(400), 64
    eng = cuda_engine(ckpt, eviction=mode, eviction_sinks=4, eviction_window=64, eviction_ladder_span=64)
    eng.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    got: list[int] = []
    while eng.has_unfinished_requests():
        for o in eng.step():
            got += o.new_token_ids
    policy = eng.evictor.policy
    assert eng.evictor.evicted_blocks_total > 0
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).cuda().eval()
    tokens = list(prompt)
    with torch.no_grad():
        for i in range(n):
            mask = visible_mask(policy, len(prompt), len(tokens), policy.window_blocks * BS).cuda()
            logits = model(torch.tensor([tokens], device="cuda"), attention_mask=mask[None, None]).logits[0, -1]
            top2 = logits.topk(2).values
            if got[i] != int(logits.argmax()):
                assert float(top2[0] - top2[1]) < 1e-3, f"token {i}: {got[i]} vs HF {int(logits.argmax())}"
                break
            tokens.append(got[i])
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
