"""Per-expert checkpoint tensors load into the stacked MoE parameters (worker/loader.py, models/moe.py).

A DeepSeek-V2 checkpoint written by `kvpilot make-model` (per-expert HF names): every expert's gate,
up and down land in their slices of `experts.w13` / `experts.w2`; a missing expert tensor leaves the
stack incomplete and is refused by name; a wrongly shaped one is refused with both shapes.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.make_model import make_model
from kvpilot.engine.models import build_model
from kvpilot.engine.models.moe import StackedExperts, stacked_piece
from kvpilot.engine.worker.loader import load_weights, weight_files

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("stacked") / "ds", "deepseek_v2", "tiny")


def fresh_model(path):
    return build_model(ModelConfig.from_dir(path)).float()


def tensors(path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        out.update(load_file(str(f)))
    return out


def test_every_expert_lands_in_its_slice(checkpoint) -> None:
    model = fresh_model(checkpoint)
    load_weights(model, checkpoint, show_progress=False)
    saved = tensors(checkpoint)
    stacks = [(n, m) for n, m in model.named_modules() if isinstance(m, StackedExperts)]
    assert stacks
    for name, experts in stacks:
        inter = experts.intermediate_size
        for e in range(experts.num_experts):
            p = f"{name}.{e}"
            assert torch.equal(experts.w13[e, :inter], saved[f"{p}.gate_proj.weight"])
            assert torch.equal(experts.w13[e, inter:], saved[f"{p}.up_proj.weight"])
            assert torch.equal(experts.w2[e], saved[f"{p}.down_proj.weight"])


def test_piece_names_only_expert_tensors(checkpoint) -> None:
    model = fresh_model(checkpoint)
    piece = stacked_piece(model, "model.layers.1.mlp.experts.3.up_proj.weight")
    assert piece is not None and piece.param == "model.layers.1.mlp.experts.w13"
    assert stacked_piece(model, "model.layers.1.mlp.experts.99.up_proj.weight") is None  # no such expert
    assert stacked_piece(model, "model.layers.1.mlp.shared_experts.up_proj.weight") is None
    assert stacked_piece(model, "model.layers.0.mlp.experts.0.up_proj.weight") is None  # dense first layer


def rewrite(checkpoint, tmp_path, change) -> str:
    out = make_model(tmp_path / "copy", "deepseek_v2", "tiny")  # same config, then the edited weights
    weights = tensors(checkpoint)
    change(weights)
    for f in weight_files(out):
        f.unlink()
    save_file(weights, str(out / "model.safetensors"))
    return str(out)


def test_a_missing_expert_leaves_its_stack_unloaded(checkpoint, tmp_path) -> None:
    path = rewrite(checkpoint, tmp_path, lambda w: w.pop("model.layers.1.mlp.experts.2.down_proj.weight"))
    with pytest.raises(ValueError, match=r"lacks parameters \['model\.layers\.1\.mlp\.experts\.w2'\]"):
        load_weights(fresh_model(path), path, show_progress=False)


def test_a_wrongly_shaped_expert_is_refused(checkpoint, tmp_path) -> None:
    def widen(w: dict[str, torch.Tensor]) -> None:
        name = "model.layers.1.mlp.experts.0.gate_proj.weight"
        w[name] = torch.zeros(w[name].shape[0] + 1, w[name].shape[1])

    path = rewrite(checkpoint, tmp_path, widen)
    with pytest.raises(ValueError, match=r"experts\.0\.gate_proj\.weight' has shape .* the model expects"):
        load_weights(fresh_model(path), path, show_progress=False)
