"""GPU tier: engine parity on CUDA with the compiled Triton kernels (run on the device machine).

fp32: kvpilot (Triton kernels, `ieee` dot precision) against HF fp32. Different reduction orders
give ~1e-6 relative differences, so tokens are compared exactly, except that a divergence is
accepted at a near-tie: where HF's own logits for the two candidate tokens differ by < 1e-3
(teacher-forced on the shared prefix); after a divergence the continuations legitimately differ.

bf16: exact equality with any reference is not expected (bf16 keeps ~3 significant digits, and
HF's bf16 and ours round at different places). Instead, each token kvpilot picks in bf16 must be
near-optimal under HF fp32 teacher-forced on kvpilot's own output: its fp32 logit within
BF16_LOGIT_TOL of the best one. Measured on CPU (torch reference path, bf16) for these models the
worst deficit is ~0.007 while the median top-1/top-2 gap is 0.04-0.6; an injected bug where
decode attention drops the newest token from its context gave a worst deficit of 0.175.
"""

from __future__ import annotations

import pytest

from kvpilot.engine.llm import LLM
from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.models import build_hf_checkpoint
from tests.parity.test_engine_parity import CONFIGS, MAX_NEW, PROMPTS, VARIANTS

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
NEAR_TIE = 1e-3
BF16_LOGIT_TOL = 0.05


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    import transformers

    built = {}
    for name, (family, kv_heads) in VARIANTS.items():
        path = build_hf_checkpoint(
            tmp_path_factory.mktemp(name), family, seed=len(name), num_key_value_heads=kv_heads
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
        built[name] = (str(path), model)
    return built


@torch.no_grad()
def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens], device="cuda")).logits[0].float()


@torch.no_grad()
def hf_greedy_cuda(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device="cuda")
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=2
    )
    return out[0, len(prompt) :].tolist()


def assert_equal_up_to_near_ties(model, prompt: list[int], expected: list[int], got: list[int]) -> None:
    for i, (e, g) in enumerate(zip(expected, got, strict=False)):
        if e != g:
            logits = hf_logits(model, prompt + expected[:i])[-1]
            gap = abs(float(logits[e] - logits[g]))
            assert gap < NEAR_TIE, f"diverged at token {i}: HF {e} vs kvpilot {g}, logit gap {gap:.2e}"
            return
    assert len(got) == len(expected), f"length differs: HF {len(expected)} vs kvpilot {len(got)}"


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fp32_triton_matches_hf(hf_models, variant: str, config_name: str, monkeypatch) -> None:
    monkeypatch.delenv("KVPILOT_KERNELS", raising=False)  # CUDA tensors take the Triton kernels
    path, model = hf_models[variant]
    # An explicit pool: automatic sizing would give each test's engine most of the GPU.
    kwargs = {"num_kv_blocks": 256, **CONFIGS[config_name]}
    llm = LLM(path, device="cuda", dtype="float32", show_progress=False, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    for _ in range(2 if llm.engine.config.enable_prefix_caching else 1):
        outs = llm.generate(PROMPTS, params)
        for prompt, out in zip(PROMPTS, outs, strict=True):
            expected = hf_greedy_cuda(model, prompt, MAX_NEW)
            assert_equal_up_to_near_ties(model, prompt, expected, out["token_ids"])
    if config_name.startswith("tiny-pool"):
        assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.stats()["kv"]["blocks_used"] == 0


@pytest.mark.parametrize("variant", ["llama-gqa4", "qwen2-gqa"])
def test_bf16_tokens_are_near_optimal_under_fp32(hf_models, variant: str) -> None:
    path, model = hf_models[variant]
    llm = LLM(
        path,
        device="cuda",
        dtype="bfloat16",
        num_kv_blocks=256,
        show_progress=False,
        max_num_batched_tokens=16,
    )
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        tokens = out["token_ids"]
        logits = hf_logits(model, prompt + tokens)[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
        chosen = logits.gather(-1, torch.tensor(tokens, device="cuda")[:, None])[:, 0]
        worst = float((logits.max(-1).values - chosen).max())
        assert worst < BF16_LOGIT_TOL, f"{variant}: a bf16 token is {worst:.3f} below the fp32 best"


def test_kv_pool_sized_from_gpu_memory(hf_models) -> None:
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    path, _ = hf_models["llama-mha"]
    llm = LLM(path, device="cuda", gpu_memory_utilization=0.2, show_progress=False)
    feed = llm.engine.stats()
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0 < feed["memory_bytes"]["kv_pool"] < 0.2 * total
    assert feed["memory_bytes"]["activation_peak"] > 0 and feed["memory_bytes"]["torch_allocated"] > 0
    outs = llm.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=4))
    assert all(len(o["token_ids"]) >= 1 for o in outs)
