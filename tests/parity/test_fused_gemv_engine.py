"""EngineConfig.fused_gemv_rows: steps of few tokens run each Llama-family layer's o_proj and down_proj
fused with the norms after them (kernels/gemv_norm). Same tokens as HF on the torch path (where the op is
the separate ops), and the Triton kernels under the interpreter give the logits of the unfused engine."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.llm import LLM
from tests.helpers.forced_logits import teacher_forced_logits
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import greedy_ids, hf_reference_fixture, make_engine, mixed_prompts

pytestmark = pytest.mark.parity

PROMPTS = mixed_prompts()
MAX_NEW = 8


def build(out_dir, name: str):
    return build_hf_checkpoint(out_dir, name.split("-")[0], seed=3, num_key_value_heads=2)


checkpoint = hf_reference_fixture(build, PROMPTS, MAX_NEW)


@pytest.mark.parametrize("checkpoint", ["llama-gqa", "qwen2-gqa"], indirect=True)
def test_fused_steps_generate_what_hf_does(checkpoint) -> None:
    path, expected = checkpoint
    llm = LLM(path, show_progress=False, fused_gemv_rows=64, max_num_batched_tokens=16)
    layers = llm.engine.runner.model.model.layers
    assert {layer.fused_gemv_rows for layer in layers} == {64}
    assert greedy_ids(llm, PROMPTS, MAX_NEW) == expected


def test_a_wrapped_attention_keeps_the_separate_ops(tmp_path) -> None:
    """A strategy that wraps self_attn (here the GQA fallback reserve) is not fused: its forward is its own."""
    path = build_hf_checkpoint(tmp_path, "llama", seed=4, num_key_value_heads=4)
    eng = make_engine(path, fused_gemv_rows=8, attention="gqa", kv_head_groups=2, fallback_reserve=0.2)
    layer = eng.runner.model.model.layers[0]
    assert type(layer.self_attn).__name__ == "GqaReserveAttention"
    assert layer.fused_gemv_rows == 8 and layer._fused(1) == (False, True)  # the MLP is plain
    plain = make_engine(path, fused_gemv_rows=8).runner.model.model.layers[0]
    assert plain._fused(8) == (True, True) and plain._fused(9) == (False, False)
    handle = plain.self_attn.register_forward_pre_hook(lambda *_: None)  # as calibration capture does
    assert plain._fused(1) == (False, True)
    handle.remove()


def test_each_projection_fuses_on_its_own(tmp_path) -> None:
    path = build_hf_checkpoint(tmp_path, "llama", seed=4, num_key_value_heads=2)
    for projections, fused in (("o_proj", (True, False)), ("down_proj", (False, True))):
        layer = make_engine(path, fused_gemv_rows=8, fused_gemv_projections=projections).runner.model.model.layers[0]
        assert layer._fused(4) == fused
    with pytest.raises(ValueError, match="fused_gemv_projections must be one of"):
        make_engine(path, fused_gemv_projections="qkv")


@pytest.mark.kernels
@pytest.mark.parametrize("projections", ["o_proj,down_proj", "o_proj", "down_proj"])
def test_the_triton_kernels_give_the_unfused_logits(tmp_path, monkeypatch, projections: str) -> None:
    path = build_hf_checkpoint(tmp_path, "llama", seed=5, num_key_value_heads=2)
    prompts, continuations = [p[:12] for p in PROMPTS[:2]], [[5, 9, 11, 7], [3, 8, 13, 21]]
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    ref = teacher_forced_logits(make_engine(path, block_size=8), prompts, continuations)
    got = teacher_forced_logits(make_engine(path, block_size=8, fused_gemv_rows=4, fused_gemv_projections=projections), prompts, continuations)
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4)  # fp32: the GEMV sums K in another order
