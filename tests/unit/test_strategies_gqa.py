"""GQA conversion by mean-pooling KV heads."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.strategies.gqa.convert import convert_state_dict_to_gqa, mean_pool_heads

pytestmark = pytest.mark.unit


def gqa_attention(x: torch.Tensor, wq, wk, wv, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """Causal attention of x [T, hidden] with HF's grouping (query head h reads KV head h // group)."""
    t = x.shape[0]
    q = (x @ wq.T).view(t, num_heads, -1)
    k = (x @ wk.T).view(t, num_kv_heads, -1).repeat_interleave(num_heads // num_kv_heads, dim=1)
    v = (x @ wv.T).view(t, num_kv_heads, -1).repeat_interleave(num_heads // num_kv_heads, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


def test_one_head_per_group_is_exact() -> None:
    w = torch.randn(6 * 8, 32)
    b = torch.randn(6 * 8)
    assert torch.equal(mean_pool_heads(w, num_kv_heads=6, groups=6), w)
    assert torch.equal(mean_pool_heads(b, num_kv_heads=6, groups=6), b)


def test_groups_are_means_of_consecutive_heads() -> None:
    w = torch.randn(4 * 3, 5)
    pooled = mean_pool_heads(w, num_kv_heads=4, groups=2)
    heads = w.view(4, 3, 5)
    assert torch.allclose(pooled.view(2, 3, 5)[1], (heads[2] + heads[3]) / 2)


def test_pooling_is_exact_when_grouped_heads_agree() -> None:
    torch.manual_seed(0)
    heads, dim, hidden = 8, 16, 64
    wq = torch.randn(heads * dim, hidden) / hidden**0.5
    base_k, base_v = torch.randn(2, dim, hidden), torch.randn(2, dim, hidden)
    wk = base_k.repeat_interleave(4, dim=0).reshape(heads * dim, hidden)
    wv = base_v.repeat_interleave(4, dim=0).reshape(heads * dim, hidden)
    x = torch.randn(9, hidden)
    mha = gqa_attention(x, wq, wk, wv, heads, heads)
    gqa = gqa_attention(x, wq, mean_pool_heads(wk, heads, 2), mean_pool_heads(wv, heads, 2), heads, 2)
    assert torch.allclose(gqa, mha, atol=1e-5)


def test_state_dict_conversion_touches_only_k_and_v() -> None:
    sd = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 8),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(16, 8),
        "model.layers.0.self_attn.k_proj.bias": torch.randn(16),
        "model.layers.0.self_attn.v_proj.weight": torch.randn(16, 8),
        "model.embed_tokens.weight": torch.randn(10, 8),
    }
    out = convert_state_dict_to_gqa(sd, num_kv_heads=4, groups=2)
    assert out["model.layers.0.self_attn.k_proj.weight"].shape == (8, 8)
    assert out["model.layers.0.self_attn.k_proj.bias"].shape == (8,)
    assert out["model.layers.0.self_attn.v_proj.weight"].shape == (8, 8)
    assert out["model.layers.0.self_attn.q_proj.weight"] is sd["model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(ValueError, match="no k_proj"):
        convert_state_dict_to_gqa({"x.weight": torch.zeros(2)}, 1, 1)


@pytest.mark.parametrize("groups", [0, 3, 5])
def test_rejects_groups_that_do_not_divide_heads(groups: int) -> None:
    with pytest.raises(ValueError, match="divisor"):
        mean_pool_heads(torch.zeros(4 * 2, 3), num_kv_heads=4, groups=groups)


def test_calibration_with_nothing_to_merge_is_refused_before_weights_load(tmp_path, monkeypatch) -> None:
    """kv_head_groups equal to the checkpoint's KV heads serves it as it is: a calibration text would
    be silently unused, so it is refused by name before any weight loads."""
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine
    from kvpilot.engine.worker import model_runner
    from tests.helpers.models import build_hf_checkpoint

    path = build_hf_checkpoint(tmp_path / "llama", "llama")
    heads = __import__("json").loads((path / "config.json").read_text())["num_key_value_heads"]
    text = tmp_path / "cal.txt"
    text.write_text("def f(x):\n    return x\n" * 20)

    def no_load(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr(model_runner, "load_weights", no_load)
    with pytest.raises(ValueError, match=f"kv_head_groups {heads} equals the checkpoint's {heads} KV heads"):
        LLMEngine(EngineConfig(model=str(path), device="cpu", attention="gqa", kv_head_groups=heads,
                               conversion_calibration=str(text)))  # fmt: skip
