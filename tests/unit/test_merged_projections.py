"""Merged QKV and gate/up GEMMs (layers/parallel.MergedLinear): the same outputs as separate linears,
weights loaded and rewritten through the linears as before."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.context import dense_context
from kvpilot.engine.layers.parallel import MergedLinear
from kvpilot.engine.make_model import make_model
from kvpilot.engine.models import build_model
from kvpilot.engine.worker.loader import load_weights

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: q/k/v biases
def test_merged_model_matches_the_separate_one(family: str, tmp_path) -> None:
    root = make_model(tmp_path / family, family)
    config = ModelConfig.from_dir(root)
    separate, merged = build_model(config), build_model(config)
    merged.merge_projections()
    for model in (separate, merged):
        load_weights(model, root, show_progress=False)
    attn, mlp = merged.model.layers[0].self_attn, merged.model.layers[0].mlp
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.qkv.weight.untyped_storage().data_ptr()
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.gate_up.weight.untyped_storage().data_ptr()
    assert sum(p.numel() for p in merged.parameters()) == sum(p.numel() for p in separate.parameters())
    ids = torch.randint(0, config.vocab_size, (12,))
    with torch.no_grad(), dense_context():
        want = separate(ids, torch.arange(12))
        got = merged(ids, torch.arange(12))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_writes_through_a_linear_reach_the_merged_gemm() -> None:
    torch.manual_seed(0)
    q, k, v = nn.Linear(8, 6), nn.Linear(8, 2), nn.Linear(8, 2)
    merged = MergedLinear([q, k, v])
    x = torch.randn(3, 8)
    with torch.no_grad():
        k.weight.copy_(torch.randn(2, 8))  # in place, as GQA compensation and calibration write
        outs = merged(x)
        for lin, out in zip((q, k, v), outs, strict=True):
            torch.testing.assert_close(out, lin(x))
        v.weight = nn.Parameter(torch.randn(2, 8))  # replaced, as module.to() or a strategy could
        outs = merged(x)
        torch.testing.assert_close(outs[2], v(x))
        assert v.weight.untyped_storage().data_ptr() == merged.weight.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="bias"):
        MergedLinear([nn.Linear(8, 2), nn.Linear(8, 2, bias=False)])
