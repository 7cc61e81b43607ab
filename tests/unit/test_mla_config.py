"""DeepSeek config parsing (HF 5 `rope_parameters` and the original `rope_scaling` format) and YaRN math."""

from __future__ import annotations

import pytest

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.models.deepseek_v2 import deepseek_rope, softmax_scale

pytestmark = pytest.mark.unit

# DeepSeek-V2-Lite's attention / rope fields, in the original (remote-code) config.json format.
V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 102400,
    "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "topk_method": "greedy",
    "routed_scaling_factor": 1.0, "norm_topk_prob": False, "rope_theta": 10000, "max_position_embeddings": 163840,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "rms_norm_eps": 1e-6, "bos_token_id": 100000, "eos_token_id": 100001, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_v2_lite_fields_and_latent_width() -> None:
    mc = ModelConfig.from_dict(V2_LITE)
    f = mc.deepseek
    assert mc.family == "deepseek_v2" and mc.rope_scaling is None and f is not None
    assert f.latent_width == 576 and f.qk_head_dim == 192 and f.q_lora_rank is None
    assert (f.scoring_func, f.topk_method, f.norm_topk_prob) == ("softmax", "greedy", False)
    assert f.rope_yarn["factor"] == 40 and f.rope_interleave


def test_yarn_matches_hf() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = {k: v for k, v in V2_LITE.items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf_config = transformers.DeepseekV2Config(**raw)
    want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    f = ModelConfig.from_dict(V2_LITE).deepseek
    got_freq, got_factor = deepseek_rope(f.qk_rope_head_dim, 10000.0, f.rope_yarn)
    torch.testing.assert_close(got_freq, want_freq.float(), rtol=1e-6, atol=0)
    assert got_factor == pytest.approx(want_factor, rel=1e-12)
    hf_attention = transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2Attention(hf_config, 0)
    assert softmax_scale(f) == pytest.approx(hf_attention.scaling, rel=1e-12)


def test_bad_fields_are_refused() -> None:
    with pytest.raises(ValueError, match="rope type 'linear' is not supported"):
        ModelConfig.from_dict({**V2_LITE, "rope_scaling": {"type": "linear", "factor": 2}})
    with pytest.raises(ValueError, match="needs n_group dividing n_routed_experts"):
        ModelConfig.from_dict(
            {**V2_LITE, "topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1}
        )
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_dict({**V2_LITE, "num_experts_per_tok": 65})
