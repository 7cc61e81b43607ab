"""GPU tier: MLA in the engine on CUDA (compiled Triton latent store and absorbed decode).

The mla_decode kernel's tl.dot runs fp32 inputs in TF32 on the GPU, so tokens are not compared
exactly. As in test_engine_gpu's bf16 check, each token kvpilot picks must be near-optimal under HF
fp32 teacher-forced on kvpilot's own output: its fp32 logit within LOGIT_TOL of the best one.
Native DeepSeek-V2/V3 (all parity variants: q_lora or not, routing kinds, YaRN), fp32 and bf16,
under chunked prefill, prefix caching and a pool that forces preemption; and the MLA conversion of
a Llama checkpoint at full rank on CUDA, checked the same way against HF's Llama.
"""

from __future__ import annotations

import pytest

from kvpilot.engine.llm import LLM
from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.deepseek import build_deepseek_checkpoint
from tests.helpers.models import build_hf_checkpoint
from tests.parity.test_deepseek_parity import CONFIGS, MAX_NEW, PROMPTS, VARIANTS

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
LOGIT_TOL = 0.05


@pytest.fixture(scope="module")
def hf_deepseek(tmp_path_factory):
    import transformers

    built = {}
    for name, (version, seed, overrides) in VARIANTS.items():
        path = build_deepseek_checkpoint(tmp_path_factory.mktemp(name), version, seed=seed, **overrides)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
        built[name] = (str(path), model)
    return built


@torch.no_grad()
def assert_near_optimal(model, prompt: list[int], got: list[int], tol: float = LOGIT_TOL) -> None:
    logits = model(torch.tensor([prompt + got], device="cuda")).logits[0].float()
    for i, token in enumerate(got):
        row = logits[len(prompt) - 1 + i]
        deficit = float(row.max() - row[token])
        assert deficit <= tol, f"token {i}: kvpilot chose {token}, {deficit:.3f} below HF's best"


# bf16 for the V2 variants only: V3's sigmoid routing picks topk_group=1 of 2 groups, and on CPU in
# bf16 one token of v3-qlora's 60 flips a group choice whose fp32 scores differ by 0.003 (0.9503 vs
# 0.9474), a discrete change HF's own bf16 model happens not to hit; worst V2 deficit in bf16: 0.023.
CASES = [(v, "float32") for v in VARIANTS] + [(v, "bfloat16") for v in VARIANTS if v.startswith("v2")]


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize(("variant", "dtype"), CASES)
def test_native_mla_on_cuda(hf_deepseek, variant: str, config_name: str, dtype: str, monkeypatch) -> None:
    monkeypatch.delenv("KVPILOT_KERNELS", raising=False)  # CUDA tensors take the Triton kernels
    path, model = hf_deepseek[variant]
    kwargs = {"num_kv_blocks": 256, **CONFIGS[config_name]}
    llm = LLM(path, device="cuda", dtype=dtype, show_progress=False, **kwargs)
    assert llm.engine.runner.kv_cache.is_cuda
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    for _ in range(2 if llm.engine.config.enable_prefix_caching else 1):
        outs = llm.generate(PROMPTS, params)
        for prompt, out in zip(PROMPTS, outs, strict=True):
            assert_near_optimal(model, prompt, out["token_ids"])
    if config_name == "tiny-pool-preempt":
        assert llm.engine.scheduler.num_preemptions > 0


def test_mla_conversion_full_rank_on_cuda(tmp_path, monkeypatch) -> None:
    import transformers

    monkeypatch.delenv("KVPILOT_KERNELS", raising=False)
    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=1, num_key_value_heads=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    llm = LLM(str(path), device="cuda", dtype="float32", show_progress=False, num_kv_blocks=64,
              attention="mla", latent_rank=64, block_size=8)  # fmt: skip
    mla = llm.engine.stats()["engine"]["mla"]
    assert mla["mode"] == "converted" and mla["reconstruction_error"] < 1e-5
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert_near_optimal(model, prompt, out["token_ids"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mla_conversion_fused_decode_on_cuda(tmp_path, monkeypatch, dtype: str) -> None:
    """RoPE on every dim at full rank, head_dim 32: decode through the fused kernel (kernels/mla_conversion)
    in CUDA graphs (session 8; first run on a GPU pending), near-optimal under HF's fp32 model."""
    import transformers

    monkeypatch.delenv("KVPILOT_KERNELS", raising=False)
    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=1, num_key_value_heads=2, head_dim=32)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    llm = LLM(str(path), device="cuda", dtype=dtype, show_progress=False, num_kv_blocks=64,
              attention="mla", latent_rank=64, block_size=8)  # fmt: skip
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    graphs = llm.engine.runner.decode_graphs
    assert graphs is not None and graphs.replays_total > 0, "the conversion's decode steps were not replayed"
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert_near_optimal(model, prompt, out["token_ids"], LOGIT_TOL if dtype == "float32" else 0.1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_partial_rope_conversion_absorbed_on_cuda(tmp_path, monkeypatch, dtype: str) -> None:
    """mla_rope_dims = head_dim at full rank reproduces the checkpoint; its decode runs the mla_decode
    Triton kernel with a block-diagonal rope query (strategies/mla/absorbed.py)."""
    import transformers

    from kvpilot.engine.strategies.mla import absorbed

    monkeypatch.delenv("KVPILOT_KERNELS", raising=False)
    calls = []
    kernel = absorbed.latent_attention_triton

    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr("kvpilot.engine.strategies.mla.partial.latent_attention_triton", counted)
    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=1, num_key_value_heads=2)  # head_dim 16
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    llm = LLM(str(path), device="cuda", dtype=dtype, show_progress=False, num_kv_blocks=64,
              attention="mla", latent_rank=32, mla_rope_dims=16, block_size=8)  # fmt: skip
    mla = llm.engine.stats()["engine"]["mla"]
    assert mla["absorbed_decode"] and mla["latent_width"] == 32 + 2 * 16
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    assert calls, "decode did not go through the Triton kernel"
    graphs = llm.engine.runner.decode_graphs  # captured since session 8 (worker/cuda_graphs.absorbed_conversion)
    assert graphs is not None and graphs.replays_total > 0, "the absorbed conversion's decode steps were not replayed"
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert_near_optimal(model, prompt, out["token_ids"], LOGIT_TOL if dtype == "float32" else 0.1)
