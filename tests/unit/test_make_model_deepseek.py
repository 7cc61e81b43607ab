"""`kvpilot make-model --family deepseek_v2`: tiny (q_lora) and small (no q_lora) MLA + MoE checkpoints."""

from __future__ import annotations

import json

import pytest

from kvpilot.engine.llm import LLM
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("size", "q_lora"), [("tiny", 24), ("small", None)])
def test_deepseek_checkpoint_loads_and_generates(tmp_path, size: str, q_lora: int | None) -> None:
    path = make_model(tmp_path / size, "deepseek_v2", size, seed=1)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV2ForCausalLM"] and config["q_lora_rank"] == q_lora
    assert (config["n_routed_experts"], config["num_experts_per_tok"], config["n_shared_experts"]) == (
        4,
        2,
        1,
    )
    assert config["first_k_dense_replace"] == 1 and config["head_dim"] == config["qk_rope_head_dim"]
    # The loader is strict both ways: every tensor has a parameter and every parameter a tensor.
    llm = LLM(str(path), show_progress=False)
    attn = llm.engine.runner.model.model.layers[1].self_attn
    assert hasattr(attn, "q_a_proj") == (q_lora is not None)
    assert (
        llm.engine.stats()["engine"]["mla"]["latent_width"]
        == config["kv_lora_rank"] + config["qk_rope_head_dim"]
    )
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=3))[0]
    assert len(out["token_ids"]) == 3
